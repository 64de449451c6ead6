"""AttriBoT: leave-one-out context attribution for language models, and its speed-up tricks.

Liu, Kandpal & Raffel 2025, "AttriBoT: A Bag of Tricks for Efficiently Approximating
Leave-One-Out Context Attribution" (ICLR). The score of a context span is the drop in the
log-likelihood of a fixed response when the span is removed from the prompt:
LOO_j = ℓ(C) − ℓ(C \\ c_j), ℓ = Σ_t log p(y_t | prompt, y_<t). Tricks: KV-cache reuse (exact),
hierarchical paragraph-then-sentence LOO, a smaller proxy model, and proxy pruning with target
rescoring. Peer: ContextCite (Cohen-Wang, Shah, Georgiev & Madry 2024, "ContextCite:
Attributing Model Generation to Context"): random ablations and a sparse linear surrogate.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from explainers.explanation import ExplainResult, Explanation, OptionError
from explainers.games import BudgetError
from explainers.sentences import ContextTree, build_tree

VERSION = "1"
DEFAULT_TEMPLATE = "{context}\n\nQuestion: {query}\nAnswer:"
_PLACEHOLDER = re.compile(r"\{(context|query)\}")
MAX_CONTEXT_CHARS = 20_000


class AttriBoTFields(BaseModel):
    """The instance: a context, a query and (optionally) the response to attribute."""

    model_config = ConfigDict(extra="forbid")
    context: str | list[str] = Field(
        ...,
        description="the context: text (paragraphs are its non-empty lines) or a list of "
        "paragraphs",
    )
    query: str = Field(..., min_length=1, max_length=2000)
    response: str | None = Field(
        None,
        max_length=4000,
        description="the response to attribute; default: generated greedily by the model "
        "(parameters.max_new_tokens) and returned in details.response",
    )


class AttriBoTOptions(BaseModel):
    """Method and tricks. Defaults marked (ours) are not given by the paper."""

    model_config = ConfigDict(extra="forbid")
    method: Literal["attribot", "loo", "contextcite"] = Field(
        "attribot",
        description="attribot: LOO with the tricks below; loo: exact LOO without any trick "
        "(the reference); contextcite: random ablations + Lasso surrogate",
    )
    granularity: Literal["sentence", "paragraph"] = "sentence"
    kv_cache: bool = Field(True, description="reuse the cached keys/values of the shared prefix")
    hierarchical: bool = Field(False, description="paragraph LOO first, then sentences inside")
    keep_paragraphs: int = Field(2, ge=1, description="hierarchical: paragraphs kept (ours: 2)")
    proxy_model: str | None = Field(
        None, description="score with this smaller LM instead of the target (e.g. smollm2-135m)"
    )
    prune: bool = Field(False, description="proxy LOO prunes sentences, the target rescores")
    pruning_model: str = Field("smollm2-135m", description="prune: the proxy that prunes")
    keep_sentences: int = Field(5, ge=1, description="prune: sentences kept (ours: 5)")
    max_new_tokens: int = Field(
        32, ge=1, le=256, description="response generation (ours: 32; paper: 512)"
    )
    stop: str | None = Field(
        "\n",
        max_length=20,
        description="a generated response ends before the first occurrence of this text "
        "(ours: a newline; a pretrained model keeps writing past its answer)",
    )
    prompt_template: str = Field(
        DEFAULT_TEMPLATE,
        max_length=2000,
        description="with {context} and {query} once each (ours: plain text; gemma3-270m is "
        "a pretrained model without a chat template)",
    )
    batch_size: int = Field(8, ge=1, le=64, description="ablations per forward pass")
    n_ablations: int = Field(64, ge=2, le=1024, description="contextcite (library default)")
    keep_prob: float = Field(0.5, gt=0, lt=1, description="contextcite: P(span kept)")
    lasso_alpha: float = Field(0.01, ge=0, description="contextcite: Lasso α (paper's 0.01)")


@dataclass
class _Run:
    """Shared state of one explanation: prompt rendering, response tokens, accounting."""

    tree: ContextTree
    query: str
    template: str
    response: str
    kv_cache: bool
    batch_size: int
    passes: dict[str, int] = field(default_factory=dict)
    computed: dict[str, int] = field(default_factory=dict)  # tokens run per model
    tokens: dict[str, list[int]] = field(default_factory=dict)  # response ids per model

    def prompt(self, lm: Any, removed: frozenset[int]) -> list[int]:
        context = self.tree.without(removed)
        values = {"context": context, "query": self.query}
        text = _PLACEHOLDER.sub(lambda m: values[m.group(1)], self.template)
        return [int(i) for i in lm.encode(text, bos=True)]

    def response_ids(self, lm: Any) -> list[int]:
        if lm.name not in self.tokens:  # tokenizers differ: the text is re-encoded per model
            self.tokens[lm.name] = [int(i) for i in lm.encode(self.response, bos=False)]
        return self.tokens[lm.name]

    def count(self, lm: Any, n: int, tokens: int) -> None:
        self.passes[lm.name] = self.passes.get(lm.name, 0) + n
        self.computed[lm.name] = self.computed.get(lm.name, 0) + tokens

    def reference(self, lm: Any, prompt: list[int], response: list[int]) -> tuple[float, Any]:
        """ℓ of the unablated prompt, and its keys/values when the KV cache is on."""
        self.count(lm, 1, len(prompt) + len(response))
        if self.kv_cache:
            return lm.full_pass(prompt, response)
        return float(lm.response_log_likelihood([prompt], response)[0][0]), None

    def loo(
        self, lm: Any, base: frozenset[int], units: Sequence[frozenset[int]]
    ) -> tuple[np.ndarray, float]:
        """ℓ(base context) − ℓ(base without unit) per unit (sets of sentence indices)."""
        response = self.response_ids(lm)
        prompt = self.prompt(lm, base)
        prompts = [self.prompt(lm, base | unit) for unit in units]
        for p in (prompt, *prompts):
            if len(p) + len(response) > lm.max_tokens:
                raise OptionError(
                    f"prompt and response take {len(p) + len(response)} tokens of "
                    f"{lm.name}; at most {lm.max_tokens}"
                )
        full, prefix = self.reference(lm, prompt, response)
        changed = [k for k, p in enumerate(prompts) if p != prompt]  # else: removes nothing
        scores = np.zeros(len(units))
        if changed:
            ll, n, tokens = lm.response_log_likelihood(
                [prompts[k] for k in changed], response, prefix=prefix, batch_size=self.batch_size
            )
            scores[changed] = full - ll
            self.count(lm, n, tokens)
        return scores, full


def _top(scores: np.ndarray, k: int) -> set[int]:
    """Indices of the k highest scores, ties at the cutoff kept (AttriBoT)."""
    if k >= len(scores):
        return set(range(len(scores)))
    cutoff = np.sort(scores)[::-1][k - 1]
    return {int(i) for i in np.flatnonzero(scores >= cutoff)}


def _contextcite(
    run: _Run, lm: Any, n_spans: int, units: list[frozenset[int]], o: AttriBoTOptions, seed: int
) -> tuple[np.ndarray, float, dict[str, Any]]:
    """Lasso weights of span presence fitted to per-token log-likelihoods, × response tokens."""
    from sklearn.linear_model import Lasso

    rng = np.random.default_rng(seed)
    keep = rng.random((o.n_ablations, n_spans)) < o.keep_prob  # [m, n] True = span present
    response = run.response_ids(lm)
    prompt = run.prompt(lm, frozenset())
    full, prefix = run.reference(lm, prompt, response)
    prompts = [
        run.prompt(lm, frozenset().union(*(units[j] for j in np.flatnonzero(~row)))) for row in keep
    ]
    ll, n, tokens = lm.response_log_likelihood(
        prompts, response, prefix=prefix, batch_size=o.batch_size
    )
    run.count(lm, n, tokens)
    x = keep.astype(np.float64)
    mean, std = x.mean(axis=0), x.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    fit = Lasso(alpha=o.lasso_alpha, fit_intercept=True, random_state=seed)
    fit.fit((x - mean) / std, ll / len(response))
    weights = fit.coef_ / std * len(response)
    return (
        weights,
        full,
        {
            "ablations": o.n_ablations,
            "surrogate_intercept": float(
                (fit.intercept_ - (fit.coef_ * mean / std).sum()) * len(response)
            ),
        },
    )


def _check(o: AttriBoTOptions) -> None:
    names = sorted(set(_PLACEHOLDER.findall(o.prompt_template)))
    counts = [o.prompt_template.count("{" + n + "}") for n in ("context", "query")]
    if names != ["context", "query"] or counts != [1, 1]:
        raise OptionError("prompt_template needs {context} and {query}, once each")
    if o.method != "attribot" and (o.hierarchical or o.prune or o.proxy_model):
        raise OptionError(f"method {o.method!r} takes no tricks (hierarchical, prune, proxy)")
    if o.granularity == "paragraph" and (o.hierarchical or o.prune):
        raise OptionError("hierarchical and prune work on sentences: granularity 'sentence'")
    if o.prune and o.proxy_model:
        raise OptionError("prune rescores with the target; it does not combine with proxy_model")


def attribute(
    lm: Any,
    context: str | Sequence[str],
    query: str,
    response: str | None = None,
    options: AttriBoTOptions | None = None,
    *,
    resolve: Callable[[str], Any] | None = None,
    seed: int = 0,
    budget: int | None = None,
) -> tuple[Explanation, dict[str, Any]]:
    """Attribute `response` (or a greedy generation) to the spans of `context`.

    `lm` is a models.lm.LanguageModel; `resolve` maps a proxy model name to another one.
    Returns the explanation (one value per span at the requested granularity) and the
    options as resolved.
    """
    o = options or AttriBoTOptions()
    _check(o)
    start = time.perf_counter()
    if sum(len(p) for p in ([context] if isinstance(context, str) else context)) > (
        MAX_CONTEXT_CHARS
    ):
        raise OptionError(f"context longer than {MAX_CONTEXT_CHARS} characters")
    tree = build_tree(context)
    generated = response is None
    run = _Run(tree, query, o.prompt_template, "", o.kv_cache and o.method != "loo", o.batch_size)
    if generated:
        ids = run.prompt(lm, frozenset())
        if len(ids) + o.max_new_tokens > lm.max_tokens:
            raise OptionError(f"prompt takes {len(ids)} tokens; at most {lm.max_tokens} in all")
        response = str(lm.tokenizer.decode(lm.generate(ids, o.max_new_tokens)))
        if o.stop:
            response = response.split(o.stop)[0]
        if not response.strip():
            raise OptionError("the model generated an empty response: send one in `response`")
    assert response is not None
    if not response.strip():
        raise OptionError("response is empty")
    run.response = response
    seconds: dict[str, float] = {"generate": time.perf_counter() - start}

    def model(name: str | None) -> Any:
        if name is None or name == lm.name:
            return lm
        if resolve is None:
            raise OptionError(f"no model {name!r} to use as a proxy")
        return resolve(name)

    sentence_level = o.granularity == "sentence"
    n_sent = len(tree.sentences)
    units = (
        [frozenset({j}) for j in range(n_sent)]
        if sentence_level
        else [frozenset(tree.sentences_in(p)) for p in range(len(tree.paragraphs))]
    )
    spans = tree.sentences if sentence_level else tree.paragraphs
    n = len(units)
    scorer = model(o.proxy_model)
    needed = {
        "loo": 1 + n,
        "attribot": 1 + n,
        "contextcite": 1 + o.n_ablations,
    }[o.method]
    if budget is not None and o.method == "contextcite":
        if budget < 3:
            raise BudgetError("contextcite needs a budget of at least 3 forward passes")
        o = o.model_copy(update={"n_ablations": budget - 1})
        needed = budget
    elif budget is not None and not (o.hierarchical or o.prune) and budget < needed:
        raise BudgetError(f"{o.method} needs {needed} forward passes here; budget is {budget}")

    values = np.zeros(n)
    scored_by = ["target loo" if scorer is lm else f"proxy loo ({scorer.name})"] * n
    extra: dict[str, Any] = {}
    t0 = time.perf_counter()
    if o.method == "contextcite":
        values, full, extra = _contextcite(run, lm, n, units, o, seed)
        scored_by = ["contextcite"] * n
    else:
        candidates = list(range(n))
        base: frozenset[int] = frozenset()
        if o.hierarchical:
            paragraph_units = [frozenset(tree.sentences_in(p)) for p in range(len(tree.paragraphs))]
            para_scores, full = run.loo(scorer, base, paragraph_units)
            kept = _top(para_scores, o.keep_paragraphs)
            base = frozenset().union(*(u for p, u in enumerate(paragraph_units) if p not in kept))
            candidates = [j for j in candidates if tree.paragraph_of[j] in kept]
            extra["paragraph_scores"] = para_scores.tolist()
            extra["kept_paragraphs"] = sorted(kept)
            seconds["paragraph_loo"] = time.perf_counter() - t0
        if o.prune:
            t1 = time.perf_counter()
            pruner = model(o.pruning_model)
            proxy_scores, _ = run.loo(pruner, base, [units[j] for j in candidates])
            keep = _top(proxy_scores, o.keep_sentences)
            extra["proxy_scores"] = dict(
                zip((str(j) for j in candidates), proxy_scores.tolist(), strict=True)
            )
            dropped = [j for k, j in enumerate(candidates) if k not in keep]
            base = base | frozenset(dropped)
            candidates = [j for k, j in enumerate(candidates) if k in keep]
            seconds["proxy_prune"] = time.perf_counter() - t1
        t2 = time.perf_counter()
        scores, base_ll = run.loo(scorer, base, [units[j] for j in candidates])
        values[candidates] = scores
        seconds["loo"] = time.perf_counter() - t2
        full = base_ll  # the reference of the scores: the (pruned) context's likelihood
        extra["reference_context"] = "pruned" if base else "full"
        for j in range(n):
            if j in candidates:
                scored_by[j] += " in pruned context" if base else ""
            elif o.hierarchical and tree.paragraph_of[j] not in extra["kept_paragraphs"]:
                scored_by[j] = "not scored: paragraph dropped (hierarchical)"
            else:
                scored_by[j] = f"not scored: pruned by {o.pruning_model}"
    seconds["total"] = time.perf_counter() - start
    total_passes = sum(run.passes.values())
    details = {
        "context": tree.text,
        "query": query,
        "response": response,
        "response_generated": generated,
        "response_tokens": len(run.response_ids(lm)),
        "method": o.method,
        "granularity": o.granularity,
        "spans": [
            {
                "text": s.text,
                "start": s.start,
                "end": s.end,
                "paragraph": tree.paragraph_of[k] if sentence_level else k,
                "score": float(values[k]),
                "scored": not scored_by[k].startswith("not scored"),
                "scored_by": scored_by[k],
            }
            for k, s in enumerate(spans)
        ],
        "log_likelihood": full,
        "forward_passes": dict(run.passes),
        "tokens_computed": dict(run.computed),
        "seconds": {k: round(v, 4) for k, v in seconds.items()},
        **extra,
    }
    explanation = Explanation(
        output_index=0,
        values=values,
        base_value=float(full),  # LOO's reference point is the full context
        instance_output_value=float(full),
        exact=o.method == "loo"
        or (o.method == "attribot" and scorer is lm and not (o.hierarchical or o.prune)),
        n_model_evals=total_passes,
        estimator=o.method,
        players=tuple(spans),
        details=details,
    )
    return explanation, o.model_dump(mode="json")


def explain(
    model: Any,
    inputs: np.ndarray,
    *,
    options: AttriBoTOptions,
    target: int | None = None,
    seed: int = 0,
    budget: int | None = None,
    background: np.ndarray | None = None,
    context: str | list[str],
    query: str,
    response: str | None = None,
) -> ExplainResult:
    """The registry entry: one AttriBoT explanation of a `lm` model's response."""
    from models.lm import SOURCES, LanguageModel, shared_language_model

    del inputs, background
    if not isinstance(model, LanguageModel):
        raise OptionError("attribot explains language models (modality lm)")
    if target not in (None, 0):
        raise OptionError("a language model has one output: the response log-likelihood")

    def resolve(name: str) -> Any:
        if name not in SOURCES:
            raise OptionError(f"unknown proxy model {name!r}; built-in LMs: {sorted(SOURCES)}")
        return shared_language_model(name, model.cache_dir)

    explanation, params = attribute(
        model, context, query, response, options, resolve=resolve, seed=seed, budget=budget
    )
    return ExplainResult(
        explanations=(explanation,),
        player_names=(),
        parameters=params,
        budget=explanation.n_model_evals,
        additive=False,
        meta={
            "forward_passes": explanation.details["forward_passes"] if explanation.details else {}
        },
    )
