"""Integrated gradients of text classifiers on their input embeddings.

The idea of captum's LayerIntegratedGradients on the word-embedding layer (Sundararajan et al.
2017): the path runs from a baseline text's embeddings (each token replaced by the mask token,
or the pad token, or zero vectors; special tokens kept) to the text's, the gradient is taken
with respect to the embeddings, and a token's attribution is its embedding difference times the
path-averaged gradient, summed over the embedding dimensions. Words get the sum of their
tokens; tokens outside every word (punctuation) are reported in `details.unassigned`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from explainers.estimators.budget import MemoryBudgetError
from explainers.explanation import ExplainResult, Explanation, OptionError, Span
from explainers.games import BudgetError, NotDifferentiableError, check_deadline
from explainers.games.text import word_spans
from models.base import DEFAULT_MAX_BATCH_BYTES, mib

if TYPE_CHECKING:
    from explainers.gradients.integrated import IntegratedGradientsOptions
    from models.base import Model

TEXT_BASELINES = ("mask", "pad", "zero")
CHUNK = 64  # at most this many path points per backward pass


class EmbeddingHook(Protocol):
    """What a text model offers for gradients on its input embeddings."""

    mask_id: int | None
    pad_id: int | None

    def encode(
        self, text: str
    ) -> tuple[list[int], list[int], list[tuple[int, int]], list[bool]]: ...

    def embed(self, ids: torch.Tensor) -> torch.Tensor: ...

    def scores(self, embeds: torch.Tensor, types: torch.Tensor, output: str) -> torch.Tensor: ...

    def module(self, types: torch.Tensor) -> torch.nn.Module: ...

    def embedding_std(self) -> torch.Tensor: ...


def hook_of(model: Model) -> EmbeddingHook | None:
    """The model's embedding hook (Hugging Face text classifiers), else None."""
    return getattr(model, "embeddings", None)


def _baseline(
    hook: EmbeddingHook, kind: str, ids: torch.Tensor, special: torch.Tensor, x: torch.Tensor
) -> torch.Tensor:
    if kind == "zero":
        return torch.where(special[:, None], x, torch.zeros_like(x))
    token = hook.mask_id if kind == "mask" else hook.pad_id
    if token is None:
        raise OptionError(f"baseline {kind!r}: the tokenizer has no {kind} token")
    with torch.no_grad():
        return hook.embed(torch.where(special, ids, token)[None])[0]


def token_values(
    hook: EmbeddingHook,
    x: torch.Tensor,
    b: torch.Tensor,
    types: torch.Tensor,
    target: int,
    alphas: np.ndarray,
    weights: np.ndarray,
    output: str,
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
) -> torch.Tensor:
    """Σ_dims (x - b) ∘ Σ_a w_a ∇ f_target(b + α_a (x - b)): one value per token. [t]

    The first point's forward and backward pass is measured (models/device.py peak_bytes):
    the others go in passes of as many points as `max_batch_bytes` holds (at most CHUNK);
    MemoryBudgetError when one point does not fit. The deadline is checked before each pass.
    """
    from models.device import peak_bytes

    path = torch.zeros_like(x)

    def run(start: int, stop: int) -> None:
        check_deadline()
        a = torch.tensor(alphas[start:stop], dtype=x.dtype, device=x.device)
        w = torch.tensor(weights[start:stop], dtype=x.dtype, device=x.device)
        with torch.enable_grad():
            points = (b[None] + a[:, None, None] * (x - b)[None]).detach().requires_grad_(True)
            out = hook.scores(points, types.expand(len(a), -1), output)[:, target]
            (grad,) = torch.autograd.grad(out.sum(), points)
        path.add_((w[:, None, None] * grad).sum(dim=0))  # in place: nothing of before is freed

    per_point = peak_bytes(x.device, lambda: run(0, 1))
    if per_point > max_batch_bytes:
        raise MemoryBudgetError(
            f"one path point of this text ({x.shape[0]} tokens) takes {mib(per_point)} in a "
            f"forward and backward pass; MAX_BATCH_BYTES allows {mib(max_batch_bytes)}"
        )
    chunk = CHUNK if per_point <= 0 else max(1, min(CHUNK, max_batch_bytes // per_point))
    for start in range(1, len(alphas), chunk):
        run(start, min(len(alphas), start + chunk))
    return ((x - b) * path).sum(dim=-1)


def explain_text(
    model: Model,
    texts: Sequence[str],
    options: IntegratedGradientsOptions,
    target: int | None,
    budget: int | None,
) -> ExplainResult:
    """Integrated gradients on the input embeddings of each text, per word."""
    from explainers.gradients.integrated import pick_target, quadrature, resolve

    hook = hook_of(model)
    if hook is None:
        raise NotDifferentiableError(
            f"{model.name}: gradients on text need a Hugging Face text classifier's embeddings"
        )
    if options.estimator != "path":
        raise OptionError("on text models integrated gradients takes estimator 'path'")
    kind = options.baseline if "baseline" in options.model_fields_set else "mask"
    if kind not in TEXT_BASELINES:
        raise OptionError(f"on text models the baseline is one of {list(TEXT_BASELINES)}")
    echo = resolve(options.model_copy(update={"baseline": "zero"}))
    echo["baseline"] = kind
    steps = int(echo["steps"])
    cost = steps + 2  # the path's points, and the text's and the baseline's scores
    if budget is not None and cost > budget:
        raise BudgetError(f"{steps} steps cost {cost} model evaluations; budget {budget}")
    alphas, weights = quadrature(options.method, steps)
    explanations = []
    for text in texts:
        ids_l, types_l, offsets, special_l = hook.encode(str(text))
        ids, types = torch.tensor(ids_l), torch.tensor([types_l])
        special = torch.tensor(special_l, dtype=torch.bool)
        with torch.no_grad():
            x = hook.embed(ids[None])[0]  # [t, d]
            special = special.to(x.device)
            b = _baseline(hook, kind, ids.to(x.device), special, x)
            ends = hook.scores(torch.stack([x, b]), types.expand(2, -1), options.output)
        ends_np = ends.double().cpu().numpy()
        out = pick_target(model, target, ends_np[0])
        tokens = token_values(
            hook, x, b, types, out, alphas, weights, options.output, model.max_batch_bytes
        )
        explanations.append(
            explanation_of(str(text), tokens, offsets, special_l, ends_np, out, cost)
        )
    return ExplainResult(
        tuple(explanations),
        (),
        echo,
        cost,
        additive=all(e.details and e.details["unassigned"] == 0.0 for e in explanations),
    )


def explanation_of(
    text: str,
    tokens: torch.Tensor,
    offsets: list[tuple[int, int]],
    special: list[bool],
    ends: np.ndarray,
    out: int,
    cost: int = 0,
) -> Explanation:
    """One text's explanation from its token values: per word, tokens in details."""
    from explainers.gradients.integrated import check_finite

    values = tokens.double().cpu().numpy()
    words = word_spans(text)
    per_word = np.zeros(len(words))
    unassigned = 0.0
    token_rows: list[dict[str, Any]] = []
    for value, (start, end), is_special in zip(values, offsets, special, strict=True):
        if is_special or end <= start:
            continue
        token_rows.append({"text": text[start:end], "start": start, "end": end, "value": value})
        k = next((i for i, w in enumerate(words) if w.start <= start < w.end), None)
        if k is None:
            unassigned += float(value)
        else:
            per_word[k] += value
    base, full = float(ends[1, out]), float(ends[0, out])
    check_finite(values, base, full)
    return Explanation(
        output_index=out,
        values=per_word,
        base_value=base,
        instance_output_value=full,
        exact=False,
        n_model_evals=cost,
        estimator="ig-embeddings",
        players=tuple(Span(w.text, w.start, w.end) for w in words),
        details={
            "completeness_gap": float(values.sum()) + base - full,
            "unassigned": unassigned,
            "tokens": [{**r, "value": float(r["value"])} for r in token_rows],
        },
    )
