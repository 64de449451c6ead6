"""Server-side stand-ins for a model that lives in a worker process.

A TorchScript model becomes a `WorkerModule`: an `nn.Module` holding a copy of the worker's
parameters and buffers (so `weights_hash`, `module_device`, `copy.deepcopy`, optimisers and
`state_dict` behave as on the loaded module) whose forward is a `torch.autograd.Function`: the
worker computes the outputs, and the backward pass asks the worker for the vector-Jacobian
product of the inputs (and of the weights when they require it), so gradient explainers, UNI's
unlearning copy and Salvage's fine-tuned copy work unchanged. The worker computes with its own
pristine weights until the server's copy changes (a deep copy, an optimiser step): the weights
then travel with each call. The module stays on the CPU, where its worker computes.

ONNX models and boosters become a `predict_fn` calling the worker, boosters also a
`WorkerTree` (models.base.TreeEnsemble). Declared fields come from the server's declaration;
from the worker only the measured numbers, whose types and ranges are checked.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from models.adapters.trees import LINKS
from models.base import Model
from models.declaration import Declaration, InvalidModelError
from models.sandbox.pool import WorkerGroup

FLOAT_BYTES = 8  # the widest float a worker may answer


class WorkerModule(torch.nn.Module):
    """A module whose forward and backward passes run in the model's worker."""

    def __init__(
        self,
        group: WorkerGroup,
        n_outputs: int,
        params: list[tuple[str, np.ndarray, bool]],
        buffers: list[tuple[str, np.ndarray]],
    ) -> None:
        super().__init__()
        self.group = group
        self.n_outputs = n_outputs
        self.worker_names = [n for n, _, _ in params] + [n for n, _ in buffers]
        for i, (_, value, grad) in enumerate(params):
            tensor = torch.from_numpy(value.copy())
            grad = grad and tensor.is_floating_point()
            self.register_parameter(f"p{i}", torch.nn.Parameter(tensor, requires_grad=grad))
        for i, (_, value) in enumerate(buffers):
            self.register_buffer(f"b{i}", torch.from_numpy(value.copy()))
        self.twin = False  # a copy: its own weights travel with every call
        self.synced = self._versions()

    def _versions(self) -> tuple[int, ...]:
        return tuple(t._version for t in self._state())

    def _state(self) -> list[torch.Tensor]:
        return [t for t in [*self._parameters.values(), *self._buffers.values()] if t is not None]

    def _apply(self, fn: Any, recurse: bool = True) -> WorkerModule:
        return self  # computes in its worker, on the CPU: device and dtype moves keep it there

    def __deepcopy__(self, memo: dict[int, Any]) -> WorkerModule:
        twin = WorkerModule.__new__(WorkerModule)
        torch.nn.Module.__init__(twin)
        twin.group, twin.n_outputs = self.group, self.n_outputs
        twin.worker_names = list(self.worker_names)
        for key, p in self._parameters.items():
            assert p is not None
            twin.register_parameter(
                key, torch.nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad)
            )
        for key, b in self._buffers.items():
            assert b is not None
            twin.register_buffer(key, b.detach().clone())
        twin.training = self.training
        twin.twin = True
        twin.synced = ()
        memo[id(self)] = twin
        return twin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        params = [p for p in self._parameters.values() if p is not None]
        out: torch.Tensor = _WorkerCall.apply(self, x, *params)
        return out

    def message(self, x: torch.Tensor) -> tuple[dict[str, Any], list[np.ndarray]]:
        """The call's header and arrays: the rows, and the weights when they changed."""
        header: dict[str, Any] = {"training": self.training, "seed": random.getrandbits(31)}
        rows = x.detach().to("cpu", torch.float32).contiguous().numpy()
        arrays = [rows]
        if self.twin or self._versions() != self.synced:
            header["state"] = True
            arrays += [t.detach().cpu().contiguous().numpy() for t in self._state()]
        return header, arrays

    def run_forward(self, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        header, arrays = self.message(x)
        rows = x.shape[0] if x.dim() else 1
        expected: list[tuple[int, ...] | None] = [None]
        if header.get("state") and self.training:
            expected += [tuple(b.shape) for b in self._buffers.values() if b is not None]
        _, out = self.group.call(
            {**header, "op": "forward"},
            arrays,
            max(1, rows * self.n_outputs * FLOAT_BYTES, _largest(self._state())),
            expected=None,
        )
        y = _outputs(out[0] if out else np.zeros(0), rows, self.n_outputs)
        if len(out) > 1 and len(out) == len(expected):  # updated running statistics
            with torch.no_grad():
                for b, value in zip(self._buffers.values(), out[1:], strict=True):
                    if b is not None and tuple(value.shape) == tuple(b.shape):
                        b.copy_(torch.from_numpy(value.copy()))
        return y.to(x.dtype), header

    def run_vjp(
        self, x: torch.Tensor, grad_out: torch.Tensor, seed: int, need_x: bool, need_p: bool
    ) -> tuple[torch.Tensor | None, list[torch.Tensor | None]]:
        header, arrays = self.message(x)
        header.update(op="vjp", seed=seed, need_x=need_x, need_params=need_p)
        arrays.insert(1, grad_out.detach().to("cpu", torch.float32).contiguous().numpy())
        params = [p for p in self._parameters.values() if p is not None]
        expected: list[tuple[int, ...] | None] = [tuple(x.shape) if need_x else (0,)]
        expected += [tuple(p.shape) if need_p else (0,) for p in params]
        limit = max(x.numel() * FLOAT_BYTES, _largest(params) * 2, 1)
        _, out = self.group.call(header, arrays, limit, expected=expected, what="computing "
                                 "gradients")  # fmt: skip
        gx = _float(out[0]).to(x.dtype) if need_x else None
        gps: list[torch.Tensor | None] = [
            _float(g).to(p.dtype) if need_p and p.requires_grad else None
            for p, g in zip(params, out[1:], strict=True)
        ]
        return gx, gps


def _largest(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors) * 2


def _float(a: np.ndarray) -> torch.Tensor:
    if a.dtype.kind != "f":
        raise InvalidModelError("the model worker answered non-float values")
    return torch.from_numpy(a.copy())


def _outputs(a: np.ndarray, rows: int, k: int) -> torch.Tensor:
    if a.dtype.kind != "f" or a.size != rows * k:
        raise InvalidModelError(
            f"the model worker answered shape {list(a.shape)}; expected [{rows}, {k}]"
        )
    return torch.from_numpy(a.reshape(rows, k).copy())


class _WorkerCall(torch.autograd.Function):
    """forward: the worker's outputs; backward: the worker's vector-Jacobian product."""

    @staticmethod
    def forward(ctx: Any, module: WorkerModule, x: torch.Tensor, *params: torch.Tensor) -> Any:
        y, header = module.run_forward(x)
        ctx.module, ctx.seed = module, header["seed"]
        ctx.save_for_backward(x)
        return y

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> Any:
        (x,) = ctx.saved_tensors
        need_x = bool(ctx.needs_input_grad[1])
        need_p = any(ctx.needs_input_grad[2:])
        gx, gps = ctx.module.run_vjp(x, grad_out, ctx.seed, need_x, need_p)
        return (None, gx, *gps)


class WorkerTree:
    """models.base.TreeEnsemble of a booster in a worker."""

    def __init__(
        self, group: WorkerGroup, spec: dict[str, Any], n_features: int, n_outputs: int
    ) -> None:
        library = str(spec.get("library"))
        link = str(spec.get("link"))
        if library not in ("xgboost", "lightgbm") or link not in LINKS:
            raise InvalidModelError("the model worker described an unknown booster")
        self.library = library
        self.link = link
        self.has_interactions = bool(spec.get("has_interactions"))
        self.group, self.n, self.k = group, n_features, n_outputs

    def _call(self, method: str, x: np.ndarray, shape: tuple[int, ...], **extra: Any) -> Any:
        rows = [np.ascontiguousarray(x, dtype=np.float64).reshape(len(x), -1)]
        if "background" in extra:
            rows.append(np.ascontiguousarray(extra.pop("background"), np.float64))
            rows[1] = rows[1].reshape(len(rows[1]), -1)
        limit = max(1, int(np.prod(shape)) * FLOAT_BYTES)
        reply, out = self.group.call({"op": "tree", "method": method, **extra}, rows, limit)
        if reply.get("none"):
            return None
        if len(out) != 1 or out[0].dtype.kind != "f" or out[0].size != np.prod(shape):
            raise InvalidModelError(f"the model worker answered {method} of another shape")
        return out[0].reshape(shape).astype(np.float64)

    def margin(self, x: np.ndarray) -> np.ndarray:
        result: np.ndarray = self._call("margin", x, (len(x), self.k))
        return result

    def predict(self, x: np.ndarray) -> np.ndarray:
        result: np.ndarray = self._call("predict", x, (len(x), self.k))
        return result

    def contributions(self, x: np.ndarray) -> np.ndarray:
        result: np.ndarray = self._call("contributions", x, (len(x), self.k, self.n + 1))
        return result

    def interactions(self, x: np.ndarray) -> np.ndarray | None:
        shape = (len(x), self.k, self.n + 1, self.n + 1)
        result: np.ndarray | None = self._call("interactions", x, shape)
        return result

    def interventional_values(
        self, x: np.ndarray, background: np.ndarray, prediction: bool = False
    ) -> np.ndarray:
        shape = (len(x), self.k, self.n)
        result: np.ndarray = self._call(
            "interventional_values", x, shape, background=background, prediction=prediction
        )
        return result

    def why_not_interventional(self, prediction: bool) -> str | None:
        reply, _ = self.group.call(
            {"op": "tree", "method": "why_not_interventional", "prediction": prediction},
            [],
            1,
        )
        value = reply.get("value")
        return None if value is None else str(value)[:1000]


class WorkerPredict:
    """A black box's `predict_fn`: rows -> [m, k] from the worker."""

    def __init__(self, group: WorkerGroup, k: int) -> None:
        self.group, self.k = group, k

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        k = self.k
        _, out = self.group.call({"op": "predict"}, [np.ascontiguousarray(rows)],
                                 max(1, len(rows) * k * FLOAT_BYTES))  # fmt: skip
        if len(out) != 1 or out[0].dtype.kind != "f" or out[0].size != len(rows) * k:
            raise InvalidModelError("the model worker answered predictions of another shape")
        return out[0].reshape(len(rows), k)


def worker_group(model: Model) -> WorkerGroup | None:
    """The worker group a model computes in; None for a model of the server process."""
    if isinstance(model.module, WorkerModule):
        return model.module.group
    if isinstance(model.predict_fn, WorkerPredict):
        return model.predict_fn.group
    from models.sandbox.hf_proxy import text_group

    return text_group(model)


def _count(spec: dict[str, Any], key: str, low: int = 0) -> int:
    value = spec.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise InvalidModelError(f"the model worker stated an invalid {key}")
    return value


def proxy_model(
    decl: Declaration,
    version: str,
    group: WorkerGroup,
    spec: dict[str, Any],
    arrays: list[np.ndarray],
) -> Model:
    """The server's Model of a model in `group`'s worker, from the declaration and the
    worker's spec (its kind, measured row bytes, weights)."""
    k, n = len(decl.output_names), int(np.prod(decl.input_shape))
    kind = spec.get("kind")
    dtype = spec.get("input_dtype")
    if dtype not in ("float32", "float64") or kind not in ("module", "function", "tree"):
        raise InvalidModelError("the model worker described its model wrongly")
    io = n * np.dtype(str(dtype)).itemsize + 4 * k
    fields: dict[str, Any] = {
        "row_bytes": max(_count(spec, "row_bytes"), io),  # never 0: the server never probes
        "grad_row_bytes": _count(spec, "grad_row_bytes"),
        "input_dtype": str(dtype),
    }
    info = {"source": decl.format, "sandbox": dict(group.sandbox)}
    module = None
    if kind == "module":
        names = spec.get("parameters", [])
        buffer_names = spec.get("buffers", [])
        ok = isinstance(names, list) and isinstance(buffer_names, list)
        if not ok or len(arrays) != len(names) + len(buffer_names):
            raise InvalidModelError("the model worker sent weights that do not match its names")
        params = [(str(p[0]), a, bool(p[1])) for p, a in zip(names, arrays, strict=False)]
        buffers = [(str(b), a) for b, a in zip(buffer_names, arrays[len(names) :], strict=True)]
        module = WorkerModule(group, k, params, buffers).eval()
        if fields["grad_row_bytes"] <= 0:
            fields["grad_row_bytes"] = 2 * fields["row_bytes"]
    else:
        fields["grad_row_bytes"] = 0
    tree = WorkerTree(group, dict(spec.get("tree") or {}), n, k) if kind == "tree" else None
    from models.adapters.user import (
        _model,  # the fields every user model takes from its declaration
    )

    return _model(
        decl,
        module,
        version,
        info=info,
        tree=tree,
        predict_fn=None if kind == "module" else WorkerPredict(group, k),
        **fields,
    )
