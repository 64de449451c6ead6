"""Where torch models compute (issue 20): DEVICE = auto | cpu | cuda | cuda:k.

The device is resolved once, when the service starts (an explicit CUDA device that does not
exist is an error then, not at the first request). Weights are trained, converted and cached on
disk as CPU tensors, so a model's files and its version never depend on the device; the
registry moves each loaded torch model to the device (`place`). On CUDA a model's masked-row
batches are sized by the device's free memory (`Model.rows_per_pass`), from the memory one row
took in a probe forward pass at placement.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TypeVar

import torch

from models.base import Model, ModelError, module_device, rows_for_memory

DEVICES = "auto, cpu, cuda or cuda:<index>"
PROBE_ROWS = 256  # rows of the forward pass that measures a model's memory per row
HOST_BYTES = 256 << 20  # input bytes of one masked-row batch built in host memory


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


def probe_row_bytes(model: Model, rows: int = PROBE_ROWS) -> int:
    """Peak device memory per row of a forward pass without gradients (CUDA only; 0 else)."""
    device = model.device
    if device.type != "cuda" or type(model) is not Model:
        return 0  # text models and language models batch their own token sequences
    x = torch.zeros((rows, *model.input_shape), device=device)
    if model.input_range is not None:
        x.fill_(float(model.input_range[0]))
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    with torch.no_grad():
        out = model.torch_module()(x)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del out
    floor = (model.n_features + model.n_outputs) * 4
    return max(floor, -(-peak // rows))


def place(model: M, device: torch.device) -> M:
    """The model on `device` (its module moved in place); `info["device"]` says where it runs.

    A model already there (every model when the device is the CPU) is returned as it is. On
    CUDA, `row_bytes` is measured and `batch_size` raised so that a masked-row batch fills the
    free device memory (at most HOST_BYTES of inputs built in host memory); each pass is then
    cut to the memory free at the time (`Model.rows_per_pass`). The version and the outputs
    (within float32 rounding) are the same on every device.
    """
    if not _moves(model):
        # provenance, not identity: a black box keeps its object (and its version)
        model.info["device"] = "remote" if model.platform == "remote" else "cpu"
        return model
    module = model.torch_module()
    if module_device(module) == device:
        model.info["device"] = str(device)
        return model
    module.to(device)  # in place: loaders that share a module share the move
    info = {**model.info, "device": str(device)}
    row_bytes = probe_row_bytes(model)
    if not row_bytes:
        return replace(model, info=info)
    free, _ = torch.cuda.mem_get_info(device)
    host_rows = max(1, HOST_BYTES // (4 * max(1, model.n_features)))
    batch = max(model.batch_size, min(rows_for_memory(free, row_bytes, host_rows), host_rows))
    return replace(model, info=info, row_bytes=row_bytes, batch_size=batch)
