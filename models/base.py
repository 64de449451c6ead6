"""The model type every explainer runs against: a torch module or a black box, plus metadata."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from models.modality import Modality


class ModelError(Exception):
    """Base error of the models package. Every error says what it means to a caller: `status`
    (the HTTP status the service answers with) and `code` (the error body's code)."""

    status = 422
    code = "model_error"  # the model itself failed on these inputs

    def public_message(self) -> str:
        """The message a caller reads."""
        return str(self)


class UnknownModelError(ModelError, KeyError):
    """No model is registered under that name."""

    status = 404
    code = "unknown_model"

    def public_message(self) -> str:
        return f"unknown model {self.args[0]!r}"


class ModelNotReadyError(ModelError):
    """The model exists but is not loaded (still training or failed to load)."""

    status = 503
    code = "model_not_ready"


class NoModuleError(ModelError):
    """A black box (ONNX, booster, remote endpoint, BM25) has no torch module."""


class RowTooLargeError(ModelError):
    """One row of the model takes more working memory than a model call may (MAX_BATCH_BYTES)."""

    status = 400
    code = "budget_too_small"  # cannot fit, said before computing


DEFAULT_MAX_BATCH_BYTES = 256 << 20  # the library's working memory of one model call


def mib(n: float) -> str:
    """Bytes as mebibytes, for messages."""
    return f"{n / (1 << 20):.1f} MiB"


def weights_hash(module: torch.nn.Module) -> str:
    """Content hash of a module's parameters and buffers (its version)."""
    h = hashlib.sha256()
    for key, tensor in sorted(module.state_dict().items()):
        h.update(key.encode())
        h.update(str(tuple(tensor.shape)).encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def module_device(module: torch.nn.Module) -> torch.device:
    """Where a module's weights are: its first parameter's (else buffer's) device, else the CPU."""
    for param in module.parameters():
        return param.device
    for buffer in module.buffers():
        return buffer.device
    return torch.device("cpu")


def rows_for_memory(free_bytes: int, row_bytes: int, cap: int, share: float = 0.5) -> int:
    """Rows of one forward pass that fit in `share` of a device's free memory, 1 to `cap`.

    The other half is headroom for concurrent requests and the allocator's fragmentation.
    """
    if row_bytes <= 0:
        return cap
    return max(1, min(cap, int(free_bytes * share) // row_bytes))


class TreeEnsemble(Protocol):
    """A gradient-boosted tree model read by its own library (XGBoost, LightGBM).

    Margins are the raw scores before the link: log-odds for binary classifiers (as two columns,
    [-m, m]: each class's log-odds), one score per class for multiclass, the prediction itself for
    regressors. Contributions are the library's own path-dependent TreeSHAP.
    """

    library: str
    has_interactions: bool  # the library computes SHAP interaction values
    link: str  # prediction = link^-1(margin): identity, log, logistic, softmax, other

    def margin(self, x: np.ndarray) -> np.ndarray:
        """float [m, n_features] -> float64 [m, k] raw margins."""
        ...

    def predict(self, x: np.ndarray) -> np.ndarray:
        """-> float64 [m, k]: class probabilities, or the regression prediction."""
        ...

    def why_not_interventional(self, prediction: bool) -> str | None:
        """Why interventional TreeSHAP cannot explain the margin (or the prediction) exactly;
        None: it can."""
        ...

    def interventional_values(
        self, x: np.ndarray, background: np.ndarray, prediction: bool = False
    ) -> np.ndarray:
        """-> float64 [m, k, n_features]: interventional TreeSHAP values of the margin against
        the background rows."""
        ...

    def contributions(self, x: np.ndarray) -> np.ndarray:
        """-> float64 [m, k, n_features + 1]: TreeSHAP values, the expected margin last."""
        ...

    def interactions(self, x: np.ndarray) -> np.ndarray | None:
        """-> float64 [m, k, n + 1, n + 1] SHAP interaction values, or None when the library
        has none."""
        ...


@dataclass(frozen=True)
class Model:
    """A loaded model: `predict` maps its native inputs (float32 [m, *input_shape]) to [m, k].

    A torch model has a `module`; a black box that another runtime evaluates has none and a
    `predict_fn` instead (a ranker or text model its own scoring function). `differentiable`
    is decided once, here: only a torch model without a `predict_fn` has input gradients.
    """

    name: str
    modality: Modality  # a plain string ("tabular") is made a Modality in __post_init__
    task: str  # "regression" | "classification"
    input_shape: tuple[int, ...]  # without the batch dimension
    feature_names: tuple[str, ...]
    output_names: tuple[str, ...]
    # eval mode; classifiers end in softmax (outputs are probabilities); None for black boxes
    module: torch.nn.Module | None = None
    background: np.ndarray | None = None  # [rows, *input_shape] float32, the default background
    background_info: dict[str, Any] = field(default_factory=dict)
    batch_size: int = 65536  # at most this many rows per model call (rows_per_pass: how many)
    platform: str = "pytorch"
    version: str = ""  # filled from the weights when empty; a black box's: its file's hash
    info: dict[str, Any] = field(default_factory=dict)  # provenance: dataset, seed, metrics
    reference: np.ndarray | None = None  # [rows, *input_shape] data the model's users send
    # Capabilities, declared once; the catalog of usable explainers is derived from them.
    # `module` gives input gradients; False when there is no module or a `predict_fn` (set in
    # __post_init__); a torch module may still be declared a black box (e.g. a stand-in).
    differentiable: bool = True
    input_range: tuple[float, float] | None = None  # valid input values, e.g. (0, 1) for images
    tree: TreeEnsemble | None = None  # exact TreeSHAP through the booster's own library
    # Black boxes that another runtime evaluates: rows in `input_dtype` -> [m, k], called
    # directly (not through `module`), so float64 inputs reach e.g. LightGBM's float64 splits.
    predict_fn: Callable[[np.ndarray], np.ndarray] | None = None
    input_dtype: str = "float32"
    # Working memory one row of a model call takes, measured when the model is placed
    # (models/device.py): on the CPU host memory, on CUDA device memory; 0: not measured.
    row_bytes: int = 0
    grad_row_bytes: int = 0  # the same with the backward pass to the input (torch modules)
    # The working memory of one model call (MAX_BATCH_BYTES); 0: `batch_size` rows per call.
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES

    def __post_init__(self) -> None:
        object.__setattr__(self, "modality", Modality(self.modality))
        if self.module is None or self.predict_fn is not None:
            object.__setattr__(self, "differentiable", False)
        if not self.version:  # no module: the hash of no weights, as an empty module's
            empty = hashlib.sha256().hexdigest()[:16]
            version = empty if self.module is None else weights_hash(self.module)
            object.__setattr__(self, "version", version)

    def torch_module(self) -> torch.nn.Module:
        """The torch module; NoModuleError for a black box (check `differentiable` first)."""
        if self.module is None:
            raise NoModuleError(
                f"{self.name} is a black box ({self.platform}) without a torch module"
            )
        return self.module

    @property
    def n_features(self) -> int:
        return int(np.prod(self.input_shape))

    @property
    def n_outputs(self) -> int:
        return len(self.output_names)

    @property
    def device(self) -> torch.device:
        """Where the model computes: its weights' device; the CPU for black boxes."""
        if self.predict_fn is not None or self.module is None:
            return torch.device("cpu")
        return module_device(self.module)

    @property
    def io_row_bytes(self) -> int:
        """Bytes of one row's inputs and outputs (what a model call holds at the least)."""
        return self.n_features * np.dtype(self.input_dtype).itemsize + self.n_outputs * 4

    def call_row_bytes(self, backward: bool = False) -> int:
        """Working memory of one row in a model call: as measured (`row_bytes`, with a backward
        pass `grad_row_bytes`); a black box without its own figure: twice its inputs and
        outputs (its runtime's copy of them); 0: unknown."""
        per_row = self.grad_row_bytes if backward else self.row_bytes
        if per_row <= 0 and not backward and self.predict_fn is not None:
            return 2 * self.io_row_bytes
        return per_row

    def rows_per_pass(self, backward: bool = False) -> int:
        """Rows per model call: the one rule every explainer and game follows.

        At most `batch_size`, and MAX_BATCH_BYTES (`max_batch_bytes`) over the bytes one row
        takes (`row_bytes`; `grad_row_bytes` with a backward pass), measured at placement. On
        CUDA, what fits in half the free device memory; MAX_BATCH_BYTES then bounds the rows
        built in host memory (their inputs and outputs). Never fewer than 1 row:
        RowTooLargeError when one row cannot fit.
        """
        device = self.device
        per_row = self.call_row_bytes(backward)
        cap = self.batch_size
        if self.max_batch_bytes > 0:
            host = per_row if device.type != "cuda" else self.io_row_bytes
            if host > self.max_batch_bytes:
                what = "a forward and backward pass" if backward else "a model call"
                raise RowTooLargeError(
                    f"one row of {self.name} (input {list(self.input_shape)}) takes "
                    f"{mib(host)} in {what}; MAX_BATCH_BYTES allows {mib(self.max_batch_bytes)}"
                    " per model call: raise MAX_BATCH_BYTES or use a model with smaller inputs"
                )
            if host > 0:
                cap = max(1, min(cap, self.max_batch_bytes // host))
        if device.type != "cuda" or per_row <= 0:
            return cap
        free, _ = torch.cuda.mem_get_info(device)
        return rows_for_memory(free, per_row, cap)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Batched forward pass without gradients, on the model's device; float32 [m, k] numpy.

        Chunks of `rows_per_pass()` rows, for a black box's function as for a torch module."""
        x = np.ascontiguousarray(x, dtype=self.input_dtype).reshape((-1, *self.input_shape))
        out = np.empty((x.shape[0], self.n_outputs), dtype=np.float32)
        step = self.rows_per_pass()
        if self.predict_fn is not None:
            for start in range(0, x.shape[0], step):
                rows = x[start : start + step]
                out[start : start + rows.shape[0]] = np.asarray(
                    self.predict_fn(rows), dtype=np.float32
                ).reshape(rows.shape[0], -1)
            return out
        # no_grad, not inference_mode: a TorchScript module may keep constants it built on its
        # first call, and inference tensors cannot be saved for a later backward pass.
        module, device = self.torch_module(), self.device
        with torch.no_grad():
            for start in range(0, x.shape[0], step):
                chunk = torch.from_numpy(x[start : start + step]).to(device)  # no-op on the CPU
                out[start : start + chunk.shape[0]] = (
                    module(chunk).reshape(chunk.shape[0], -1).cpu().numpy()
                )
        return out


@dataclass(frozen=True, kw_only=True)
class TextModel(Model):
    """A model of strings: `predict` maps m texts (a list or a 1-D str array) to float32 [m, k].

    `input_shape` is () and `feature_names` empty: a text's players are its own words or tokens.
    `module` holds the weights that the version hashes (None: the version is given).
    """

    predict_texts: Callable[[list[str]], np.ndarray]  # m texts -> float32 [m, k], batched
    token_spans: Callable[[str], list[tuple[int, int]]]  # the tokenizer's tokens as char offsets
    mask_token: str = "[MASK]"
    max_chars: int = 2000
    max_tokens: int = 254  # without special tokens; longer inputs would be truncated

    def predict(self, x: np.ndarray | Sequence[str]) -> np.ndarray:
        """Texts -> float32 [m, k], without gradients."""
        return np.asarray(self.predict_texts([str(t) for t in x]), dtype=np.float32)


@dataclass(frozen=True, kw_only=True)
class RankerModel(Model):
    """A ranker: scores candidate documents for a query (modality "ranker").

    `score_lists` maps m queries and m lists of K documents each to float [m, K] (higher ranks
    first). `input_shape` is () and `output_names` is ("score",): one score per document.
    """

    score_lists: Callable[[Sequence[str], Sequence[Sequence[str]]], np.ndarray]
    mask_token: str | None = None  # what replaces an absent term when absence="mask"
    max_chars: int = 4000  # per document and per query

    def score(self, query: str, documents: Sequence[str]) -> np.ndarray:
        """Scores of documents for one query. float64 [K]"""
        return np.asarray(self.score_lists([query], [documents]), dtype=np.float64)[0]

    def predict(self, x: np.ndarray | Sequence[str]) -> np.ndarray:
        raise ModelError(f"{self.name} ranks documents for a query; it has no per-row predict")
