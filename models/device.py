"""Where torch models compute (issue 20): DEVICE = auto | cpu | cuda | cuda:k.

The device is resolved once, when the service starts (an explicit CUDA device that does not
exist is an error then, not at the first request). Weights are trained, converted and cached on
disk as CPU tensors, so a model's files and its version never depend on the device; the
registry moves each loaded torch model to the device (`place`).

Memory-bounded work (issue 26): `place` also measures the working memory one row of a model
call takes, once, with and without a backward pass, and records the memory budget of one call
(MAX_BATCH_BYTES): `Model.rows_per_pass` divides one by the other. On the CPU the probe sums
the allocation and free events of torch's memory profiler in order (the peak of the running
sum is the activations' peak); on CUDA it reads the allocator's peak, and each pass is also
cut to the device memory free at the time. Black boxes state their own bytes per row (ONNX:
from the graph's shapes; remote: the JSON body; boosters: their inputs and outputs).
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

import torch

from models.base import DEFAULT_MAX_BATCH_BYTES, Model, ModelError, module_device, rows_for_memory

log = logging.getLogger(__name__)

DEVICES = "auto, cpu, cuda or cuda:<index>"
PROBE_ROWS = 256  # rows of the CUDA forward pass that measures a model's memory per row
CPU_PROBE_ROWS = 4  # rows of the CPU probe (its fixed cost is then small beside the rows')
GRAD_PROBE_ROWS = 16  # rows of the CUDA probe with a backward pass
_PROFILER = threading.Lock()  # one torch profiler at a time in a process


M = TypeVar("M", bound=Model)


class DeviceError(ModelError):
    """DEVICE names no device this machine has."""


def resolve_device(spec: str = "auto") -> torch.device:
    """The torch device of a DEVICE setting; `auto`: the first CUDA device if any, else the CPU.

    Raises DeviceError for a malformed value or a CUDA device this machine does not have.
    """
    text = spec.strip().lower()
    if text == "auto":
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if text == "cpu":
        return torch.device("cpu")
    match = re.fullmatch(r"cuda(?::(\d+))?", text)
    if match is None:
        raise DeviceError(f"DEVICE must be {DEVICES}; got {spec!r}")
    if not torch.cuda.is_available():
        raise DeviceError(
            f"DEVICE={spec} but torch sees no CUDA device (torch {torch.__version__}, CUDA "
            f"build {torch.version.cuda or 'none'}); set DEVICE=cpu or DEVICE=auto"
        )
    index, count = int(match.group(1) or 0), torch.cuda.device_count()
    if index >= count:
        raise DeviceError(
            f"DEVICE={spec} but this machine has {count} CUDA device(s): cuda:0 to cuda:{count - 1}"
        )
    return torch.device("cuda", index)


def _moves(model: Model) -> bool:
    """Whether the model computes with torch weights (black boxes and weightless modules stay
    on the CPU: ONNX, boosters, remote endpoints, BM25)."""
    module = model.module
    if model.predict_fn is not None or module is None:
        return False
    return next(module.parameters(), None) is not None or next(module.buffers(), None) is not None


def _probe_rows(model: Model, rows: int) -> torch.Tensor:
    x = torch.zeros((rows, *model.input_shape), device=model.device)
    if model.input_range is not None:
        x.fill_(float(model.input_range[0]))
    return x


def _run(model: Model, x: torch.Tensor, backward: bool) -> None:
    """One forward pass (and the backward pass to the input, as gradient explainers take)."""
    module = model.torch_module()
    if not backward:
        with torch.no_grad():
            module(x)
        return
    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        out = module(x)
        if out.requires_grad:
            torch.autograd.grad(out.sum(), x)


def prepare_probes() -> None:
    """Start torch's profiler once on the main thread (a no-op profile), where a process
    calls it first: kineto then profiles other threads (the explanation workers) without
    printing an error on stderr each time. Elsewhere: nothing."""
    if threading.current_thread() is threading.main_thread():
        cpu_peak_bytes(lambda: None)


def cpu_peak_bytes(work: Callable[[], None]) -> int:
    """Peak bytes that `work` held at once in torch's CPU allocator: the allocation and free
    events of torch's memory profiler summed in order, the peak of the running sum (what was
    allocated before is not counted). Raises RuntimeError when another profiler runs."""
    from torch.profiler import ProfilerActivity, profile

    # kineto prints two lines per profile on stderr at its default log level; a user's
    # KINETO_LOG_LEVEL wins.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    with _PROFILER, profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        work()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    running = peak = 0
    for event in events:
        running += event.nbytes()  # negative for a free
        peak = max(peak, running)
    return peak


def peak_bytes(device: torch.device, work: Callable[[], None]) -> int:
    """Peak working memory of `work` on `device`: CUDA's allocator peak over what was
    allocated before, or on the CPU `cpu_peak_bytes` (0 when another profiler runs)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        work()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - before)
    try:
        return cpu_peak_bytes(work)
    except RuntimeError as exc:  # a profiler is already running in this process
        log.warning("memory probe skipped: %s", exc)
        work()
        return 0


def probe_row_bytes(model: Model, backward: bool = False) -> int:
    """Working memory per row of a model call (with the backward pass to the input when
    `backward`), measured on the model's device: CUDA's allocator peak, or on the CPU the
    memory profiler's (`cpu_peak_bytes`) plus the row's own inputs and outputs. 0 for models
    that batch their own token sequences (text and language models)."""
    if type(model) is not Model or model.module is None or model.predict_fn is not None:
        return 0
    device = model.device
    floor = model.io_row_bytes
    if device.type == "cuda":
        rows = GRAD_PROBE_ROWS if backward else PROBE_ROWS
        x = _probe_rows(model, rows)
        return max(floor, -(-peak_bytes(device, lambda: _run(model, x, backward)) // rows))
    warm = _probe_rows(model, 1)
    _run(model, warm, backward)  # TorchScript's profiling executor optimises on early calls
    _run(model, warm, backward)
    x = _probe_rows(model, CPU_PROBE_ROWS)
    peak = peak_bytes(device, lambda: _run(model, x, backward))
    return floor + -(-peak // CPU_PROBE_ROWS) if peak > 0 else 0


def _measure(model: M) -> M:
    """The model with `row_bytes` (and `grad_row_bytes` if it has input gradients) measured,
    unless a builder stated them."""
    if model.row_bytes > 0:
        return model
    row_bytes = probe_row_bytes(model)
    if row_bytes <= 0:  # black boxes without a figure, text and language models
        return model
    grad = probe_row_bytes(model, backward=True) if model.differentiable else 0
    return replace(model, row_bytes=row_bytes, grad_row_bytes=grad)


def place(model: M, device: torch.device, max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES) -> M:
    """The model on `device` (its module moved in place), its memory per row measured once
    and `max_batch_bytes` its budget per model call; `info` says where it runs, what a row
    takes and how many rows a call gets.

    A black box keeps its object (and its version) unless its budget changes. On CUDA,
    `batch_size` is raised so that a masked-row batch fills the free device memory (rows whose
    inputs take at most `max_batch_bytes` of host memory); each pass is then cut to the memory
    free at the time (`Model.rows_per_pass`). The version and the outputs (within float32
    rounding) are the same on every device.
    """
    if _moves(model) and module_device(model.torch_module()) != device:
        model.torch_module().to(device)  # in place: loaders that share a module share the move
    where = str(device) if _moves(model) else "remote" if model.platform == "remote" else "cpu"
    measured = _measure(model)
    cap = int(model.info.get("batch_size", model.batch_size))  # before any budget
    batch, per_row = cap, measured.call_row_bytes()
    if measured.device.type == "cuda" and per_row > 0:
        free, _ = torch.cuda.mem_get_info(measured.device)
        host_rows = max(1, max_batch_bytes // measured.io_row_bytes)
        batch = max(batch, min(rows_for_memory(free, per_row, host_rows), host_rows))
    elif 0 < per_row <= max_batch_bytes:
        # batch_size says it too, for callers that size batches by it
        batch = max(1, min(cap, max_batch_bytes // per_row))
    placed = measured
    if (batch, max_batch_bytes) != (measured.batch_size, measured.max_batch_bytes):
        placed = replace(measured, batch_size=batch, max_batch_bytes=max_batch_bytes)
    if placed is not model:
        placed = replace(placed, info=dict(model.info))  # the loader's model keeps its own
    placed.info["device"] = where
    placed.info.setdefault("batch_size", cap)
    if type(placed) is Model:  # text and language models batch their own token sequences
        placed.info["row_bytes"] = placed.call_row_bytes()
        if placed.grad_row_bytes > 0:
            placed.info["grad_row_bytes"] = placed.grad_row_bytes
        placed.info["max_batch_bytes"] = max_batch_bytes
        try:
            placed.info["rows_per_call"] = placed.rows_per_pass()
        except ModelError:
            placed.info["rows_per_call"] = 0  # one row does not fit: explanations refuse it
    return placed
