"""Minimal sufficient subsets: the fewest players that, kept with the rest absent, keep the class.

A subset S is *sufficient* for class c when the game with only S present still predicts c:
argmax_k v_k(S) = c, and optionally v_c(S) >= min_probability (a robust margin) and the share of
reference rows whose own prediction stays c is >= min_precision (Anchors' precision, Ribeiro et
al. 2018, under the same absence distribution). The games and absence are Shapley's (same
players: features, image patches, words or tokens). Search:

- exact: every coalition is evaluated; the answer has the fewest players of all sufficient ones
  (ties: the highest v_c). A cardinality-minimum sufficient subset of this game.
- greedy: players ordered by an attribution of c (Shapley values, or leave-one-out drops); the
  shortest sufficient prefix of that order, then backward elimination (Carter et al. 2019,
  Sufficient Input Subsets): remove, one at a time, the player whose removal keeps v_c highest
  while the rest stays sufficient. The answer is sufficient and 1-minimal: no single player can be
  removed (every such removal was evaluated), unless the budget stopped the pruning (a caveat).

Whatever the search, the model itself is asked once more on the subset-only input(s), outside
the game's memo: `verified` says it kept the class. Sufficient subset training (SST, ICLR 2025)
trains models to output such subsets; this explainer finds them post hoc.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field

from explainers.estimators import exact
from explainers.estimators.budget import default_budget
from explainers.explanation import Caveat, ExplainResult, Explanation, OptionError, Span
from explainers.games import BudgetError, GameRecorder
from explainers.games import text as text_game
from explainers.games.deadlines import check_deadline
from explainers.games.masked import MaskedModelGame, default_patch_size, patch_groups
from explainers.masking import MaskerOptions, default_masker, resolve
from explainers.options import ARRAYS, EVERYWHERE, IMAGES, TEXTS, ExplainerOptions
from explainers.sufficient import search as subset_search
from explainers.sufficient.search import Criterion, exact_search, greedy_search, player_order
from models.base import Model, TextModel
from models.modality import Modality

VERSION = "1"
MAX_EXACT = exact.MAX_PLAYERS


class SufficientOptions(ExplainerOptions):
    """Options of the `sufficient-subset` explainer."""
    search: Annotated[Literal["auto", "exact", "greedy", "own"], EVERYWHERE] = Field(
        "auto",
        description="exact: all 2^n coalitions, a subset of minimum size; greedy: the shortest "
        "sufficient prefix of an attribution order, pruned to a 1-minimal subset; auto: exact "
        "when 2^n coalitions fit the budget (at most 20 players), else greedy; own: the subset "
        "a model trained to output one gives (SST, digits-sst), verified, no minimality claimed",
    )
    order: Annotated[Literal["shapley", "leave-one-out"], EVERYWHERE] = Field(
        "shapley",
        description="greedy search: the attribution of the kept class that orders the players "
        "(Shapley values within the budget, or leave-one-out drops: n + 1 coalitions)",
    )
    min_probability: Annotated[float | None, EVERYWHERE] = Field(
        None,
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="a sufficient subset also keeps the class probability at least this high "
        "(with a background: averaged over its rows); default: the class stays the argmax",
    )
    min_precision: Annotated[float | None, EVERYWHERE] = Field(
        None,
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="a sufficient subset also keeps the class on at least this share of the "
        "background rows (each row filling the absent players; Anchors' precision)",
    )
    masker: Annotated[MaskerOptions | None, ARRAYS] = Field(
        None,
        description="default: background for tabular models, blur for images with a side over "
        "32 px, else a zero baseline",
    )
    patch_size: Annotated[int | None, IMAGES] = Field(
        None,
        ge=1,
        le=512,
        description="image models: side of a square patch; default max(2, ceil(max(H, W) / 16))",
    )
    players: Annotated[Literal["words", "tokens"], TEXTS] = Field(
        "words", description="text models: the players are the words or the tokenizer's tokens"
    )
    absence: Annotated[Literal["delete", "mask"], TEXTS] = Field(
        "delete", description="text models: an absent player is deleted, or masked"
    )


def _with_hits(probs: np.ndarray) -> np.ndarray:
    """[m, k] probabilities -> [m, 2k]: them, then one-hot of each row's argmax (averaged over
    reference rows by the game, the second half is the share of rows predicting each class)."""
    probs = np.asarray(probs, dtype=np.float64)
    hits = np.zeros_like(probs)
    hits[np.arange(len(probs)), np.argmax(probs, axis=1)] = 1.0
    return np.concatenate([probs, hits], axis=1)


@dataclass(frozen=True)
class _Instance:
    """One instance's game over its players, and how to ask the model about one coalition."""

    game: Any  # bool [m, n] -> [m, 2k] (probabilities, then hit shares)
    n_players: int
    direct: Callable[[np.ndarray], np.ndarray]  # bool [n] -> the model's [r, k] on its input(s)
    pieces: tuple[Span, ...] | None = None
    compose: Callable[[np.ndarray], str] | None = None  # text: the coalition's text


def _array_instances(
    model: Model, inputs: np.ndarray, options: SufficientOptions, background: np.ndarray | None
) -> tuple[list[_Instance], list[str], dict[str, Any], int]:
    masking = resolve(model, options.masker or default_masker(model, background), background)
    if model.modality == Modality.IMAGE:
        patch = options.patch_size or default_patch_size(model.input_shape)
        groups, names = patch_groups(model.input_shape, patch)
    else:
        groups, names = np.arange(model.n_features), list(model.feature_names)

    def predict(rows: np.ndarray) -> np.ndarray:
        return _with_hits(model.predict(rows))

    def direct_for(x: np.ndarray, references: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        flat = np.asarray(x, dtype=model.input_dtype).reshape(-1)
        refs = references.reshape(masking.cost, -1)

        def direct(mask: np.ndarray) -> np.ndarray:  # the verifying call, not through the game
            check_deadline()
            rows = np.where(np.asarray(mask, bool)[groups], flat, refs)  # [r, d]
            return np.asarray(model.predict(rows.reshape(-1, *model.input_shape)), np.float64)

        return direct

    def instance(x: np.ndarray) -> _Instance:
        references = masking.references(model, x)  # fixed rows, or the blur of x (built once)
        game = MaskedModelGame(
            predict, x, references, groups, model.rows_per_pass(), model.input_dtype
        )
        return _Instance(game, len(names), direct_for(x, references))

    instances = [instance(x) for x in inputs]
    echo = {**options.echo(model.modality), "masker": masking.echo}
    if model.modality == Modality.IMAGE:
        echo["patch_size"] = patch
    return instances, names, echo, masking.cost


def _text_instances(
    model: TextModel, inputs: np.ndarray, options: SufficientOptions
) -> tuple[list[_Instance], dict[str, Any]]:
    def predict_texts(texts: list[str]) -> np.ndarray:
        return _with_hits(model.predict_texts(texts))

    def direct_for(game: text_game.TextGame) -> Callable[[np.ndarray], np.ndarray]:
        def direct(mask: np.ndarray) -> np.ndarray:
            check_deadline()
            return np.asarray(model.predict_texts([game.compose(mask)]), np.float64)

        return direct

    instances = []
    for g in text_game.text_games(model, inputs, options.players, options.absence):
        game = text_game.TextGame(
            predict_texts, g.text, g.pieces, options.absence, model.mask_token
        )
        instances.append(
            _Instance(game, game.n_players, direct_for(game), game.pieces, game.compose)
        )
    echo = options.echo(model.modality)
    if options.absence == "mask":
        echo["mask_token"] = model.mask_token
    return instances, echo


def _search_kind(options: SufficientOptions, n: int, coalitions: int | None) -> str:
    if options.search != "auto":
        if options.search == "exact" and n > MAX_EXACT:
            raise OptionError(f"exact search is limited to {MAX_EXACT} players, got {n}")
        return options.search
    if n > MAX_EXACT:
        return "greedy"
    if coalitions is None:  # the default budget: exact where Shapley's default is exact
        return "exact" if (1 << n) <= default_budget(n) else "greedy"
    return "exact" if (1 << n) + 1 <= coalitions else "greedy"


def _reserve(n: int) -> int:
    """Coalitions the greedy search may need besides the order: the empty and full coalitions,
    every prefix, the pruning (at most n + (n - 1) + ... + 1) and the complement."""
    return 2 + (n + 1) + n * (n + 1) // 2 + 1


def _order_minimum(options: SufficientOptions, n: int) -> int:
    """Fewest coalitions of the order: n + 1 for leave-one-out; Shapley's `auto` is exact when
    2^n fit, else KernelSHAP with at least 2n (choose_estimator checks it again)."""
    if options.order == "leave-one-out":
        return n + 1
    return min(1 << n, 2 * n) if n <= MAX_EXACT else 2 * n


def _plan_budget(
    options: SufficientOptions, kind: str, n: int, cost: int, budget: int | None
) -> tuple[int, int]:
    """(total model evaluations per instance, coalitions for the greedy order)."""
    verify = cost  # the final direct model call
    if kind == "own":  # both ends, the complement, the verification
        return subset_search.own_budget(cost, budget), 0
    if kind == "exact":
        need = ((1 << n) + 1) * cost
        if budget is None:
            return need, 0
        if budget < need:
            raise BudgetError(
                f"exact search over {n} players needs a budget of {need} model evaluations "
                f"(2^{n} + 1 coalitions at {cost} each), got {budget}"
            )
        return budget, 0
    floor = _order_minimum(options, n)
    if budget is None:
        order = n + 1 if options.order == "leave-one-out" else default_budget(n)
        return (order + _reserve(n)) * cost + verify, order
    coalitions = (budget - verify) // cost
    least = floor + n + 4  # the order, both ends, every prefix, the complement; pruning may stop
    if coalitions < least:
        raise BudgetError(
            f"budget {budget} pays for {max(coalitions, 0)} coalitions at {cost} model "
            f"evaluations each (plus {verify} to verify); the greedy search over {n} players "
            f"needs at least {least}, a budget of {least * cost + verify}"
        )
    return budget, max(floor, coalitions - _reserve(n))


def _explain_one(
    inst: _Instance,
    model: Model,
    options: SufficientOptions,
    target: int | None,
    budget: int | None,
    seed: int,
    names: list[str],
    own: np.ndarray | None = None,  # bool [n]: the model's own subset (search "own")
) -> tuple[Explanation, int]:
    n, k = inst.n_players, model.n_outputs
    cost = int(getattr(inst.game, "rows_per_coalition", 1))
    kind = _search_kind(options, n, None if budget is None else budget // cost)
    total, order_coalitions = _plan_budget(options, kind, n, cost, budget)
    rec = GameRecorder(inst.game, n, total - cost)  # the last `cost` rows verify
    table: np.ndarray | None = None
    if kind == "exact":
        table = exact.value_table(rec)  # [2^n, 2k] in bit order
        ends = table[[0, -1]]
    else:
        ends = rec(np.array([np.zeros(n, bool), np.ones(n, bool)]))  # [2, 2k]
    c = int(np.argmax(ends[1, :k])) if target is None else target
    ok = Criterion(c, k, options.min_probability, options.min_precision)
    order_values: np.ndarray | None = None
    order_name = None
    if table is not None:
        subset, minimality = exact_search(table, ok, n)
    elif own is not None:
        subset, minimality = own, "own"
    else:
        order_values, order_name = player_order(rec, options.order, c, n, order_coalitions, seed)
        subset, minimality = greedy_search(rec, ok, order_values)
    caveats: list[Caveat] = []
    details: dict[str, Any] = {
        "class": c,
        "class_name": model.output_names[c],
        "probability_full": float(ends[1, c]),
        "probability_empty": float(ends[0, c]),
        "n_players": n,
        "search": kind,
        "order": order_name,
        "criterion": {
            "argmax": True,
            "min_probability": options.min_probability,
            "min_precision": options.min_precision,
        },
    }
    if order_values is not None:
        details["order_values"] = order_values.tolist()
    if subset is None:
        caveats.append(
            Caveat(
                "no_sufficient_subset",
                f"no subset the {kind} search evaluated keeps class {c} under the criterion "
                f"(with every player present: p = {ends[1, c]:.3g}); lower min_probability or "
                "min_precision, or explain the predicted class",
            )
        )
        details.update(
            subset=None, players=None, size=None, verified=False, minimality=None,
            probability_subset=None, probability_complement=None, precision=None,
        )  # fmt: skip
        values = np.zeros(n)
        evals = rec.n_evaluations
    else:
        if table is not None:
            complement = table[int(np.dot(~subset, 1 << np.arange(n)))]
        else:
            complement = rec((~subset)[None])[0]
        direct = inst.direct(subset)  # [r, k]: the model itself, outside the memo
        evals = rec.n_evaluations + direct.shape[0]
        mean = direct.mean(axis=0)
        check = _with_hits(direct).mean(axis=0)[None]
        verified = bool(ok(check)[0])
        members = np.flatnonzero(subset)
        details.update(
            subset=members.tolist(),
            players=[inst.pieces[i].text if inst.pieces else names[i] for i in members],
            size=int(members.size),
            verified=verified,
            minimality=minimality,
            probability_subset=float(mean[c]),
            probability_complement=float(complement[c]),
            precision=float(check[0, k + c]),
        )
        if inst.compose is not None:
            details["subset_text"] = inst.compose(subset)
        if not verified:
            caveats.append(
                Caveat(
                    "not_verified",
                    "the model's own answer on the subset-only input does not keep the class "
                    "the search found (a non-deterministic model, or its own subset fails)",
                )
            )
        if minimality == "none":
            caveats.append(
                Caveat(
                    "not_minimal",
                    "the budget ran out while pruning: the subset is sufficient but a player "
                    "may still be removable; raise the budget",
                )
            )
        if members.size == 0:
            caveats.append(
                Caveat(
                    "empty_subset",
                    f"class {c} is kept with every player absent: the absence itself predicts it",
                )
            )
        values = subset.astype(np.float64)
    explanation = Explanation(
        output_index=c,
        values=values,
        base_value=float(ends[0, c]),
        instance_output_value=float(ends[1, c]),
        exact=kind == "exact",
        n_model_evals=evals,
        estimator=f"{kind}-search",
        players=inst.pieces,
        details=details,
        warnings=tuple(caveats),
    )
    return explanation, total


def explain(
    model: Model,
    inputs: np.ndarray,
    *,
    options: SufficientOptions,
    target: int | None = None,
    seed: int = 0,
    budget: int | None = None,
    background: np.ndarray | None = None,
) -> ExplainResult:
    """A minimal sufficient subset of players per input (values: 1 in the subset, else 0)."""
    if target is not None and not 0 <= target < model.n_outputs:
        raise OptionError(f"target out of range for {model.n_outputs} outputs")
    options.check_applies(model.modality)
    if isinstance(model, TextModel):
        if background is not None:
            raise OptionError("text models take no background: absent words are deleted or masked")
        instances, echo = _text_instances(model, inputs, options)
        names: list[str] = []
    else:
        instances, names, echo, _ = _array_instances(model, inputs, options, background)
    for inst in instances:  # fail before any model call
        cost = int(getattr(inst.game, "rows_per_coalition", 1))
        kind = _search_kind(options, inst.n_players, None if budget is None else budget // cost)
        _plan_budget(options, kind, inst.n_players, cost, budget)
    owns = subset_search.own_subsets(model, inputs, options)
    results = [
        _explain_one(inst, model, options, target, budget, seed, names, own)
        for inst, own in zip(instances, owns, strict=True)
    ]
    spent = max(total for _, total in results)
    return ExplainResult(tuple(e for e, _ in results), tuple(names), echo, spent, additive=False)


__all__ = ["SufficientOptions", "explain"]
