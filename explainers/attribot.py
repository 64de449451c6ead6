"""AttriBoT: leave-one-out context attribution for language models, and its speed-up tricks.

Liu, Kandpal & Raffel 2025, "AttriBoT: A Bag of Tricks for Efficiently Approximating
Leave-One-Out Context Attribution" (ICLR). The score of a context span is the drop in the
log-likelihood of a fixed response when the span is removed from the prompt:
LOO_j = ℓ(C) − ℓ(C \\ c_j), ℓ = Σ_t log p(y_t | prompt, y_<t). Tricks: KV-cache reuse (exact),
hierarchical paragraph-then-sentence LOO, a smaller proxy model, and proxy pruning with target
rescoring. Peer: ContextCite (Cohen-Wang, Shah, Georgiev & Madry 2024, "ContextCite:
Attributing Model Generation to Context"): random ablations and a sparse linear surrogate.
Here: the options and "build the game, call the estimator": the span game (games/spans.py) on
a LanguageModel (models/lm_protocol.py), leave-one-out and its narrowing (estimators/loo.py),
ContextCite's surrogate (estimators/surrogate.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from explainers.estimators import loo, surrogate
from explainers.explanation import ExplainResult, Explanation, OptionError
from explainers.games import BudgetError, GameRecorder
from explainers.games.deadlines import check_deadline
from explainers.games.sentences import build_tree
from explainers.games.spans import PLACEHOLDER, Prompting, SpanGame, SpanMaskGame
from explainers.options import EVERYWHERE, ExplainerOptions, applies
from explainers.trust import caveats
from models.lm_protocol import LanguageModelProtocol as LanguageModel

VERSION = "2"  # 2: ContextCite pays a repeated ablation once; the echo drops what did not apply
DEFAULT_TEMPLATE = "{context}\n\nQuestion: {query}\nAnswer:"
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


# Where the options apply (explainers/options.py; echoed only there): the tricks to the
# attribot method, the cache to the methods that may use one (loo is the reference: never the
# cache), generation to a response the model writes (`generated`, a value of the request).
CONTEXTCITE = applies(when={"method": ["contextcite"]})
CACHED = applies(when={"method": ["attribot", "contextcite"]})
TRICK = applies(when={"method": ["attribot"]})
HIERARCHICAL = applies(when={"hierarchical": [True]})
PRUNED = applies(when={"prune": [True]})
GENERATED = applies(when={"generated": [True]})


class AttriBoTOptions(ExplainerOptions):
    """Method and tricks. Defaults marked (ours) are not given by the paper."""
    method: Annotated[Literal["attribot", "loo", "contextcite"], EVERYWHERE] = Field(
        "attribot",
        description="attribot: LOO with the tricks below; loo: exact LOO without any trick "
        "(the reference); contextcite: random ablations + Lasso surrogate",
    )
    granularity: Annotated[Literal["sentence", "paragraph"], EVERYWHERE] = "sentence"
    kv_cache: Annotated[bool, CACHED] = Field(
        True, description="reuse the cached keys/values of the shared prefix"
    )
    hierarchical: Annotated[bool, TRICK] = Field(
        False, description="paragraph LOO first, then sentences inside"
    )
    keep_paragraphs: Annotated[int, HIERARCHICAL] = Field(
        2, ge=1, description="hierarchical: paragraphs kept (ours: 2)"
    )
    proxy_model: Annotated[str | None, TRICK] = Field(
        None, description="score with this smaller LM instead of the target (e.g. smollm2-135m)"
    )
    prune: Annotated[bool, TRICK] = Field(
        False, description="proxy LOO prunes sentences, the target rescores"
    )
    pruning_model: Annotated[str, PRUNED] = Field(
        "smollm2-135m", description="prune: the proxy that prunes"
    )
    keep_sentences: Annotated[int, PRUNED] = Field(
        5, ge=1, description="prune: sentences kept (ours: 5)"
    )
    max_new_tokens: Annotated[int, GENERATED] = Field(
        32, ge=1, le=256, description="response generation (ours: 32; paper: 512)"
    )
    stop: Annotated[str | None, GENERATED] = Field(
        "\n",
        max_length=20,
        description="a generated response ends before the first occurrence of this text "
        "(ours: a newline; a pretrained model keeps writing past its answer)",
    )
    prompt_template: Annotated[str, EVERYWHERE] = Field(
        DEFAULT_TEMPLATE,
        max_length=2000,
        description="with {context} and {query} once each (ours: plain text; gemma3-270m is "
        "a pretrained model without a chat template)",
    )
    batch_size: Annotated[int, EVERYWHERE] = Field(
        8, ge=1, le=64, description="ablations per forward pass"
    )
    n_ablations: Annotated[int, CONTEXTCITE] = Field(
        64, ge=2, le=1024, description="contextcite (library default)"
    )
    keep_prob: Annotated[float, CONTEXTCITE] = Field(
        0.5, gt=0, lt=1, description="contextcite: P(span kept)"
    )
    lasso_alpha: Annotated[float, CONTEXTCITE] = Field(
        0.01, ge=0, description="contextcite: Lasso α (paper's 0.01)"
    )


def _contextcite(
    game: SpanGame, units: list[frozenset[int]], o: AttriBoTOptions, seed: int
) -> tuple[np.ndarray, float, dict[str, Any]]:
    """ContextCite: the Lasso surrogate of the span game, fitted to per-token log-likelihoods
    (weights × response tokens). A repeated ablation costs no forward pass."""
    n_response = len(game.shared.response_ids(game.lm))
    recorder = GameRecorder(SpanMaskGame(game, tuple(units)), len(units), o.n_ablations + 1)
    est = surrogate.linear_surrogate(
        recorder,
        np.random.default_rng(seed),
        o.n_ablations,
        o.keep_prob,
        o.lasso_alpha,
        scale=n_response,
    )
    extra = {"ablations": o.n_ablations, "surrogate_intercept": float(est.base_value)}
    return est.values, float(est.full_value), extra


def _check(o: AttriBoTOptions) -> None:
    names = sorted(set(PLACEHOLDER.findall(o.prompt_template)))
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
    lm: LanguageModel,
    context: str | Sequence[str],
    query: str,
    response: str | None = None,
    options: AttriBoTOptions | None = None,
    *,
    resolve: Callable[[str], LanguageModel] | None = None,
    seed: int = 0,
    budget: int | None = None,
) -> tuple[Explanation, dict[str, Any]]:
    """Attribute `response` (or a greedy generation) to the spans of `context`.

    `resolve` maps a proxy model name to another language model. Returns the explanation (one
    value per span at the requested granularity) and the options as resolved.
    """
    o = options or AttriBoTOptions()
    _check(o)
    start = time.perf_counter()
    if sum(len(p) for p in ([context] if isinstance(context, str) else context)) > (
        MAX_CONTEXT_CHARS
    ):
        raise OptionError(f"context longer than {MAX_CONTEXT_CHARS} characters")
    tree = build_tree(context)
    kv_cache = o.kv_cache and o.method != "loo"
    shared = Prompting(tree, query, o.prompt_template, "", kv_cache, o.batch_size)
    generated = response is None
    shared.response = _response(shared, lm, response, o)
    seconds: dict[str, float] = {"generate": time.perf_counter() - start}

    def model(name: str | None) -> LanguageModel:
        if name is None or name == lm.name:
            return lm
        if resolve is None:
            raise OptionError(f"no model {name!r} to use as a proxy")
        return resolve(name)

    sentence_level = o.granularity == "sentence"
    units = (
        [frozenset({j}) for j in range(len(tree.sentences))]
        if sentence_level
        else [frozenset(tree.sentences_in(p)) for p in range(len(tree.paragraphs))]
    )
    spans = tree.sentences if sentence_level else tree.paragraphs
    n = len(units)
    o = _budgeted(o, n, budget)
    scorer = model(o.proxy_model)
    check_deadline()  # after generating the response
    if o.method == "contextcite":
        values, full, extra = _contextcite(SpanGame(lm, shared), units, o, seed)
        scored_by = ["contextcite"] * n
    else:
        values, full, extra, scored_by = _loo(shared, lm, scorer, model, units, o, seconds)
    seconds["total"] = time.perf_counter() - start
    details = {
        "context": tree.text,
        "query": query,
        "response": shared.response,
        "response_generated": generated,
        "response_tokens": len(shared.response_ids(lm)),
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
        "forward_passes": dict(shared.passes),
        "tokens_computed": dict(shared.computed),
        "seconds": {k: round(v, 4) for k, v in seconds.items()},
        # scores are log-likelihood differences: flat_game judges them in nats, not against
        # |log-likelihood| (which grows with the response) nor v(all) - v(none) (0 for LOO)
        "value_scale": caveats.value_scale("nats", caveats.FLAT_NATS),
        **extra,
    }
    explanation = Explanation(
        output_index=0,
        values=values,
        base_value=float(full),  # LOO's reference point is the full context
        instance_output_value=float(full),
        exact=o.method == "loo"
        or (o.method == "attribot" and scorer is lm and not (o.hierarchical or o.prune)),
        n_model_evals=sum(shared.passes.values()),
        estimator=o.method,
        players=tuple(spans),
        details=details,
    )
    return explanation, o.echo(values={"generated": generated})


def _response(
    shared: Prompting, lm: LanguageModel, response: str | None, o: AttriBoTOptions
) -> str:
    """The response to attribute: the given one, else a greedy generation up to `o.stop`."""
    if response is None:
        ids = shared.prompt(lm, frozenset())
        if len(ids) + o.max_new_tokens > lm.max_tokens:
            raise OptionError(f"prompt takes {len(ids)} tokens; at most {lm.max_tokens} in all")
        response = str(lm.tokenizer.decode(lm.generate(ids, o.max_new_tokens)))
        if o.stop:
            response = response.split(o.stop)[0]
        if not response.strip():
            raise OptionError("the model generated an empty response: send one in `response`")
    if not response.strip():
        raise OptionError("response is empty")
    return response


def _budgeted(o: AttriBoTOptions, n: int, budget: int | None) -> AttriBoTOptions:
    """Check the budget (forward passes) of plain LOO; contextcite spends it on ablations."""
    if budget is not None and o.method == "contextcite":
        if budget < 3:
            raise BudgetError("contextcite needs a budget of at least 3 forward passes")
        return o.model_copy(update={"n_ablations": budget - 1})
    if budget is not None and not (o.hierarchical or o.prune) and budget < 1 + n:
        raise BudgetError(f"{o.method} needs {1 + n} forward passes here; budget is {budget}")
    return o


def _removal(lm: LanguageModel, shared: Prompting) -> loo.Removal:
    """The span game of `lm` over some units with a base removed (leave-one-out's game)."""
    game = SpanGame(lm, shared)
    return lambda units, base: SpanMaskGame(game, units, base)


def _loo(
    shared: Prompting,
    lm: LanguageModel,
    scorer: LanguageModel,
    model: Callable[[str], LanguageModel],
    units: list[frozenset[int]],
    o: AttriBoTOptions,
    seconds: dict[str, float],
) -> tuple[np.ndarray, float, dict[str, Any], list[str]]:
    """LOO of every unit under `scorer`, narrowed by the hierarchy and/or proxy pruning."""
    tree, n = shared.tree, len(units)
    game = _removal(scorer, shared)
    scored_by = ["target loo" if scorer is lm else f"proxy loo ({scorer.name})"] * n
    extra: dict[str, Any] = {}
    candidates, base = list(range(n)), frozenset[int]()
    t0 = time.perf_counter()
    if o.hierarchical:
        paragraphs = [frozenset(tree.sentences_in(p)) for p in range(len(tree.paragraphs))]
        step = loo.by_groups(game, paragraphs, tree.paragraph_of, candidates, o.keep_paragraphs)
        candidates, base = step.candidates, step.base
        extra["paragraph_scores"] = step.scores.tolist()
        extra["kept_paragraphs"] = sorted(step.kept)
        seconds["paragraph_loo"] = time.perf_counter() - t0
    if o.prune:
        check_deadline()  # between the phases: each is one batched pass of a language model
        t1 = time.perf_counter()
        pruner = _removal(model(o.pruning_model), shared)
        pruned = loo.by_proxy(pruner, units, candidates, o.keep_sentences, base)
        extra["proxy_scores"] = dict(
            zip((str(j) for j in candidates), pruned.scores.tolist(), strict=True)
        )
        candidates, base = pruned.candidates, pruned.base
        seconds["proxy_prune"] = time.perf_counter() - t1
    check_deadline()
    t2 = time.perf_counter()
    est = loo.scores(game, [units[j] for j in candidates], base)
    full = float(est.full_value)
    values = np.zeros(n)
    values[candidates] = est.values
    seconds["loo"] = time.perf_counter() - t2
    extra["reference_context"] = "pruned" if base else "full"  # full: v(the pruned context)
    for j in range(n):
        if j in candidates:
            scored_by[j] += " in pruned context" if base else ""
        elif o.hierarchical and tree.paragraph_of[j] not in extra["kept_paragraphs"]:
            scored_by[j] = "not scored: paragraph dropped (hierarchical)"
        else:
            scored_by[j] = f"not scored: pruned by {o.pruning_model}"
    return values, full, extra, scored_by


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
    from models.builtin import lm as built_in  # torch: only when a language model is explained

    del inputs, background
    if not isinstance(model, built_in.LanguageModel):
        raise OptionError("attribot explains language models (modality lm)")
    if target not in (None, 0):
        raise OptionError("a language model has one output: the response log-likelihood")
    cache_dir = model.cache_dir

    def resolve(name: str) -> LanguageModel:
        if name not in built_in.SOURCES:
            raise OptionError(
                f"unknown proxy model {name!r}; built-in LMs: {sorted(built_in.SOURCES)}"
            )
        return built_in.shared_language_model(name, cache_dir, model.device)  # beside it

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
