"""A model worker's main: sandbox the process first, then build the model and serve calls.

The process comes from the forkserver's clean zygote (models/sandbox/pool.py), which imported
torch, the booster libraries, onnxruntime and this package and never held server state. Before
it reads a byte of the model it: leaves the network (an empty network namespace), moves into a
fresh empty directory that it deletes and makes its root (chroot: no host path can be opened
afterwards), limits its memory, open files, processes, core dumps and file writes (rlimits),
drops to nobody, and asks to be killed when its parent dies. Each call gets a CPU-time limit.
What it could not do is reported to the server (`sandbox` in the build reply), never hidden.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import multiprocessing
import os
import resource
import signal
import sys
import tempfile
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import torch

from models.sandbox import seccomp
from models.sandbox.protocol import ProtocolError, recv, send

CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
NOBODY = 65534
MAX_IN_BYTES = 8 << 30  # what the server sends (trusted; bounded anyway)
# Modules the worker needs after the chroot (imports then cannot read the host's files).
PRELOAD = (
    "numpy",
    "torch",
    "torch.profiler",
    "xgboost",
    "lightgbm",
    "onnxruntime",
    "onnx",
    "shap",
    "encodings.cp437",  # zip member names, decoded after the chroot
    "models.adapters.archive",
    "models.adapters.user",
    "models.adapters.trees",
    "models.adapters.onnx",
    "models.device",
    "models.adapters.facts",
    "models.sandbox.worker",
    "models.sandbox.seccomp",
    "models.adapters.torchscript_check",  # the operator allow-list
    "models.adapters.booster_check",
    "models.adapters.lightgbm_check",
    "tokenizers",
    "safetensors.torch",
    "transformers",
    "models.adapters.checkpoint",
    "models.adapters.hf",
    "models.adapters.hf_models",
    "models.builtin.lm",
    "models.adapters.onnx_text",
    "models.builtin.encoders",
    "models.sandbox.hf_worker",
    "models.sandbox.zygote",  # the warm-up of each format (its lazy imports)
)


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _wipe_initial_environment(libc: Any) -> None:
    """Zero the environment strings on the initial stack (inherited from the zygote, which got
    the server's): after clearenv nothing points there, but the bytes would stay readable."""
    with contextlib.suppress(Exception):
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start, end = int(fields[47]), int(fields[48])  # env_start, env_end (stat 50, 51)
        if 0 < start < end and end - start < (16 << 20):
            ctypes.memset(start, 0, end - start)


def _limit(kind: int, value: int) -> None:
    resource.setrlimit(kind, (value, value))


def _only(keep: tuple[int, ...]) -> str:
    """Point every open descriptor but `keep` at /dev/null (dup2: a library that holds one
    writes nowhere instead of into a descriptor number reused later); what was done."""
    if not keep or not os.path.isdir("/proc/self/fd"):
        return "inherited descriptors kept (no connection given)"
    null = os.open(os.devnull, os.O_RDWR)
    count = 0
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd in keep or fd == null:
            continue
        with contextlib.suppress(OSError):  # the listing's own descriptor, gone by now
            os.dup2(null, fd, inheritable=fd <= 2)
            count += 1
    os.close(null)
    return f"{count} inherited descriptors pointed at /dev/null; kept: the server connection"


def sandbox(
    memory_mb: int,
    threads: int,
    nproc: int,
    folder: str | None = None,
    imports: tuple[str, ...] = (),
    keep: tuple[int, ...] = (),
) -> dict[str, str]:
    """Isolate this process (see the module's docstring); what holds, by name. `keep`: the
    descriptors it keeps (its connection to the server); every other one it inherited (the
    server's stdout and stderr, the zygote's and resource tracker's pipes, a library's open
    files) is pointed at /dev/null. `root`: the
    `folder`: the server's unpacked checkpoint, made the root instead of an empty directory
    (`imports`: the modules its loader needs, imported first; models/sandbox/hf_worker.py)."""
    state: dict[str, str] = {}
    libc = _libc()
    filter_lib = seccomp.load_library()  # opened before the chroot
    for name in PRELOAD:  # normally already there (the zygote's preload)
        with contextlib.suppress(ImportError):
            __import__(name)
    torch.set_num_threads(max(1, threads))
    torch.sparse.check_sparse_tensor_invariants.enable()  # no sparse tensor past its buffer
    with contextlib.suppress(Exception):
        libc.mallopt(-8, 2)  # M_ARENA_MAX: few malloc arenas, so the address space stays small
    os.environ.clear()  # the server's environment (database URL, keys) is not the model's
    with contextlib.suppress(Exception):
        libc.clearenv()
    os.environ["KINETO_LOG_LEVEL"] = "6"
    os.environ["HOME"] = "/"  # Path.home() must answer in a chroot with no passwd (generation)
    _wipe_initial_environment(libc)
    multiprocessing.current_process().authkey = os.urandom(32)
    root = os.geteuid() == 0
    state["network"] = "isolated" if libc.unshare(CLONE_NEWNET) == 0 else "not isolated"
    state["descriptors"] = _only(keep)
    fds = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 16
    if folder is not None:
        from models.sandbox.hf_worker import preimport

        preimport(list(imports))
        os.chdir(folder)  # the checkpoint's folder, which the server removes after the build
        where = "the checkpoint's unpacked folder (read-only to nobody; removed after the build)"
    else:
        empty = tempfile.mkdtemp(prefix="model-worker-")
        os.chdir(empty)
        os.rmdir(empty)  # the working directory is now deleted: nothing can be created in it
        where = "an empty deleted directory"
    try:
        os.chroot(".")
        os.chdir("/")
        state["filesystem"] = f"chroot to {where}"
    except OSError:
        state["filesystem"] = f"not isolated (working directory: {where})"
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write then fails (EFBIG) instead
    _limit(resource.RLIMIT_CORE, 0)
    _limit(resource.RLIMIT_FSIZE, 0)  # no file can be written or grown
    _limit(resource.RLIMIT_NOFILE, max(32, fds + 16))
    if memory_mb > 0:
        _limit(resource.RLIMIT_AS, memory_mb << 20)
        state["memory"] = f"{memory_mb} MiB of address space"
    if root:
        _limit(resource.RLIMIT_NPROC, nproc)  # of uid nobody, all workers together
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        state["user"] = "nobody"
    else:
        state["user"] = f"uid {os.getuid()} (not root: privileges kept)"
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # after setuid, which clears it
    if os.getppid() == 1:  # the zygote died meanwhile
        os._exit(1)
    state["syscalls"] = seccomp.install(filter_lib)  # last: setuid and chroot are denied by it
    return state


class Served:
    """The worker's model and the operations the server may call on it."""

    def __init__(self, model: Any, state: dict[str, str]) -> None:
        self.model = model
        self.state = state
        self.module: torch.nn.Module | None = model.module
        self.scratch: torch.nn.Module | None = None  # a copy that takes the server's weights
        self.names: list[str] = []
        self.buffer_names: list[str] = []
        if self.module is not None:
            self.names = [n for n, _ in self.module.named_parameters()]
            self.buffer_names = [n for n, _ in self.module.named_buffers()]

    def spec(self) -> tuple[dict[str, Any], list[np.ndarray]]:
        m = self.model
        out: dict[str, Any] = {
            "row_bytes": int(m.row_bytes),
            "grad_row_bytes": int(m.grad_row_bytes),
            "input_dtype": str(m.input_dtype),
            "batch_size": int(m.batch_size),
            "sandbox": self.state,
            "kind": "tree" if m.tree is not None else "function" if m.predict_fn else "module",
        }
        arrays: list[np.ndarray] = []
        if m.tree is not None:
            out["tree"] = {
                "library": str(m.tree.library),
                "has_interactions": bool(m.tree.has_interactions),
                "link": str(m.tree.link),
            }
        if out["kind"] == "module" and self.module is not None:
            params = dict(self.module.named_parameters())
            buffers = dict(self.module.named_buffers())
            out["parameters"] = [[n, bool(params[n].requires_grad)] for n in self.names]
            out["buffers"] = self.buffer_names
            tensors = [params[n] for n in self.names] + [buffers[n] for n in self.buffer_names]
            arrays = [t.detach().cpu().contiguous().numpy() for t in tensors]
        return out, arrays

    def _module(self, header: dict[str, Any], arrays: list[np.ndarray]) -> torch.nn.Module:
        """The module to run: the loaded one, or the scratch copy with the weights sent."""
        assert self.module is not None
        if not header.get("state"):
            module = self.module
        else:
            if self.scratch is None:
                self.scratch = copy.deepcopy(self.module)
            module = self.scratch
            tensors = dict(module.named_parameters()) | dict(module.named_buffers())
            with torch.no_grad():
                for name, value in zip(self.names + self.buffer_names, arrays, strict=True):
                    tensors[name].copy_(torch.from_numpy(value.copy()))
        training = bool(header.get("training"))
        if module.training != training:
            module.train(training)
        if training:  # dropout: the same masks in the backward pass's recomputation
            torch.manual_seed(int(header.get("seed", 0)))
        return module

    def _output(self, out: Any, rows: int) -> torch.Tensor:
        if not isinstance(out, torch.Tensor) or not out.is_floating_point():
            raise TypeError(f"the module returned {type(out).__name__}, not a float tensor")
        k = self.model.n_outputs
        if out.dim() == 0 or out.shape[0] != rows or out.numel() != rows * k:
            raise ValueError(f"the module returned shape {list(out.shape)}; expected [{rows}, {k}]")
        return out

    def forward(
        self, header: dict[str, Any], arrays: list[np.ndarray]
    ) -> tuple[dict[str, Any], list[np.ndarray]]:
        x = torch.from_numpy(arrays[0].copy())
        module = self._module(header, arrays[1:])
        with torch.no_grad():
            out = self._output(module(x), x.shape[0])
        reply: list[np.ndarray] = [out.detach().numpy()]
        if header.get("state") and header.get("training") and self.buffer_names:
            buffers = dict(module.named_buffers())
            reply += [buffers[n].detach().numpy() for n in self.buffer_names]
        return {}, reply

    def vjp(
        self, header: dict[str, Any], arrays: list[np.ndarray]
    ) -> tuple[dict[str, Any], list[np.ndarray]]:
        x = torch.from_numpy(arrays[0].copy()).requires_grad_(bool(header.get("need_x")))
        grad_out = torch.from_numpy(arrays[1].copy())
        module = self._module(header, arrays[2:])
        need_params = bool(header.get("need_params"))
        params = [p for _, p in module.named_parameters()]
        for p in params:
            p.requires_grad_(need_params and p.is_floating_point())
        inputs = ([x] if x.requires_grad else []) + [p for p in params if p.requires_grad]
        with torch.enable_grad():
            out = self._output(module(x), x.shape[0])
            grads: tuple[torch.Tensor | None, ...] = (None,) * len(inputs)
            if inputs and out.requires_grad:
                grads = torch.autograd.grad(
                    out, inputs, grad_out.reshape(out.shape).to(out.dtype), allow_unused=True
                )
        found = dict(zip([id(t) for t in inputs], grads, strict=True))

        def of(t: torch.Tensor) -> np.ndarray:
            g = found.get(id(t))
            return (torch.zeros_like(t) if g is None else g).detach().numpy()

        reply = [of(x) if header.get("need_x") else np.zeros(0, np.float32)]
        reply += [of(p) if need_params else np.zeros(0, np.float32) for p in params]
        return {}, reply

    def predict(
        self, header: dict[str, Any], arrays: list[np.ndarray]
    ) -> tuple[dict[str, Any], list[np.ndarray]]:
        fn = self.model.predict_fn
        out = np.asarray(fn(arrays[0]))
        if out.dtype.kind != "f":
            out = out.astype(np.float64)
        return {}, [out]

    def tree(
        self, header: dict[str, Any], arrays: list[np.ndarray]
    ) -> tuple[dict[str, Any], list[np.ndarray]]:
        tree, method = self.model.tree, str(header.get("method"))
        if method == "why_not_interventional":
            return {"value": tree.why_not_interventional(bool(header.get("prediction")))}, []
        if method == "interventional_values":
            values = tree.interventional_values(arrays[0], arrays[1], bool(header["prediction"]))
            return {}, [np.asarray(values, np.float64)]
        if method not in ("margin", "predict", "contributions", "interactions"):
            raise ValueError(f"unknown tree method {method!r}")
        out = getattr(tree, method)(arrays[0])
        if out is None:
            return {"none": True}, []
        return {}, [np.asarray(out, np.float64)]


def _skip_file_checks() -> None:
    """Tests of the sandbox itself (SandboxConfig.skip_file_checks, never a setting): the
    operator allow-list and the booster checks let everything through, in this worker only,
    so that what they would refuse meets the sandbox instead."""
    import models.adapters.booster_check
    import models.adapters.lightgbm_check
    import models.adapters.torchscript_check

    def nothing(*_: Any) -> None:
        return None

    checks: Any = models.adapters.torchscript_check
    checks.check_source = checks.check_module = nothing
    checks = models.adapters.booster_check
    checks.xgboost_checked = lambda data: data
    checks = models.adapters.lightgbm_check
    checks.lightgbm_checked = lambda data: data


def _build(header: dict[str, Any], arrays: list[np.ndarray], state: dict[str, str]) -> Served:
    from models.adapters.user import build_model, register
    from models.declaration import Declaration
    from models.device import place

    meta, data = header["meta"], arrays[0].tobytes()
    if header.get("skip_file_checks"):
        _skip_file_checks()
    device = torch.device("cpu")
    budget = int(header["max_batch_bytes"])
    if header.get("check"):  # registration: the loader, the checks and the test passes
        model, _ = register(Declaration.from_dict(meta), {"model": data}, device, budget)
    elif header.get("probe"):  # a stored model, built for the first time in this server
        model = place(build_model(meta, {"model": data}), device, budget)
    else:  # a restart: the server knows the model's figures
        model = build_model(meta, {"model": data})
    return Served(model, state)


def _error(exc: BaseException) -> dict[str, Any]:
    from models.adapters.trees import BoosterError
    from models.base import ModelError, RowTooLargeError
    from models.declaration import InvalidModelError

    text = str(exc)
    memory = isinstance(exc, MemoryError) or "can't allocate memory" in text
    kind = (
        "memory" if memory
        else "invalid_model" if isinstance(exc, InvalidModelError)
        else "booster" if isinstance(exc, BoosterError)
        else "row_too_large" if isinstance(exc, RowTooLargeError)
        else "model_error"
    )  # fmt: skip
    if isinstance(exc, ModelError):  # the library's own message, meant for the user
        return {"ok": False, "kind": kind, "error": text[:1000]}
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    message = lines[-1] if lines else type(exc).__name__
    return {"ok": False, "kind": kind, "error": f"{type(exc).__name__}: {message}"[:1000]}


def main(
    conn: Connection,
    memory_mb: int,
    threads: int,
    nproc: int,
    root: str | None = None,
    imports: tuple[str, ...] = (),
) -> None:
    """Sandbox, then serve: the first message builds the model, the others call it."""
    state = sandbox(memory_mb, threads, nproc, root, imports, keep=(conn.fileno(),))
    served: Served | None = None
    ops: frozenset[str] = frozenset({"forward", "vjp", "predict", "tree"})
    while True:
        try:
            header, arrays = recv(conn, MAX_IN_BYTES, None, MAX_IN_BYTES)
        except (EOFError, OSError, ProtocolError):
            os._exit(0)  # the server is gone (or broke the framing)
        op = header.get("op")
        try:
            if op == "facts":  # what the file states (XGBoost: read by its own loader)
                from models.adapters.facts import file_facts

                if header.get("skip_file_checks"):
                    _skip_file_checks()

                facts = file_facts(str(header["format"]), arrays[0].tobytes())
                reply, out = {"facts": facts.__dict__}, list[np.ndarray]()
            elif op == "build" and header["meta"].get("format") == "huggingface":
                from models.sandbox.hf_worker import OPS, HfServed, build

                served = HfServed(build(header["meta"], bool(header.get("check"))), state)
                ops = OPS
                reply, out = served.spec()
                reply["sandbox"] = state
            elif op == "build":
                served = _build(header, arrays, state)
                reply, out = served.spec() if header.get("spec") else ({}, [])
                reply["sandbox"] = state
            elif served is None or op not in ops:
                raise ValueError(f"unexpected operation {op!r}")
            else:
                used = resource.getrusage(resource.RUSAGE_SELF)
                spent = int(used.ru_utime + used.ru_stime)
                cpu = int(header.get("cpu_s", 0))
                if cpu > 0:  # this call's CPU time: SIGXCPU kills the process past it
                    resource.setrlimit(resource.RLIMIT_CPU, (spent + cpu, resource.RLIM_INFINITY))
                reply, out = getattr(served, str(op))(header, arrays)
            send(conn, {"ok": True, **reply}, out)
        except BaseException as exc:  # reported, then the next message
            answer = _error(exc)
            try:
                send(conn, answer)
            except (OSError, ValueError):
                os._exit(1)
            if answer["kind"] == "memory":  # allocators after a failed allocation: start over
                sys.stdout.flush()
                os._exit(3)
