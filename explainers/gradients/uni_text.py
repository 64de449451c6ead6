"""UNI on the input embeddings of text classifiers (Choi, Duplessis & Belongie, ICLR 2025).

The three stages of explainers/gradients/uni.py, with the text's input embeddings [t, d] as the
input: unlearn the class on a copy of the weights, search the baseline embeddings by PGD in a ball
around the text's (special tokens kept), then integrated gradients from them, as
explainers/gradients/integrated_text.py does (values per word, per token in details). The ball's
radius is per embedding dimension: epsilon times the vocabulary embeddings' standard deviation
(`std` units, the default on text) or epsilon itself (`input`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from explainers.explanation import ExplainResult, OptionError
from explainers.games import BudgetError, NotDifferentiableError, check_deadline
from explainers.gradients.integrated import pick_target, quadrature
from explainers.gradients.integrated_text import explanation_of, hook_of, token_values

if TYPE_CHECKING:
    from explainers.gradients.uni import UniOptions
    from models.base import Model


def explain_text_uni(
    model: Model,
    texts: Sequence[str],
    options: UniOptions,
    target: int | None,
    budget: int | None,
) -> ExplainResult:
    """UNI attributions of each text's words for one class (the predicted one by default)."""
    from explainers.gradients.uni import (
        _BISECTIONS,
        _DOUBLINGS,
        _caveats,
        match_baseline,
        unlearned_output,
    )

    hook = hook_of(model)
    if hook is None:
        raise NotDifferentiableError(
            f"{model.name}: UNI on text needs a Hugging Face text classifier's embeddings"
        )
    if model.task != "classification":
        raise OptionError("UNI unlearns a class (cross-entropy): it needs a classifier")
    options.check_applies(model.modality)  # clip_min and clip_max: embeddings have no range
    search = 1 + _DOUBLINGS + _BISECTIONS + 1 if options.unlearning_rule == "line_search" else 0
    cost = (  # as explainers/gradients/uni.py counts it
        options.unlearning_steps * (1 + search) + 1 + options.pgd_steps + 1 + options.ig_steps + 2
    )
    if budget is not None and cost > budget:
        raise BudgetError(f"UNI with these options costs {cost} model evaluations; budget {budget}")
    units = "std" if options.epsilon_units == "auto" else options.epsilon_units
    epsilon = options.epsilon or (1.0 if units == "std" else 0.15)
    options = options.model_copy(update={"epsilon_units": units, "epsilon": epsilon})
    echo: dict[str, Any] = options.echo(model.modality)
    echo["pgd_step_size"] = options.pgd_step_size or epsilon / 4
    alphas, weights = quadrature(options.method, options.ig_steps)
    explanations = []
    for text in texts:
        check_deadline()  # between texts: withdrawn work stops before the next one
        ids_l, types_l, offsets, special_l = hook.encode(str(text))
        types = torch.tensor([types_l])
        module = hook.module(types)
        with torch.no_grad():
            x = hook.embed(torch.tensor([ids_l]))  # [1, t, d]
        special = torch.tensor(special_l, dtype=torch.bool, device=x.device)
        scale = hook.embedding_std().to(x.device) if units == "std" else torch.ones(x.shape[-1])
        eps = (epsilon * scale.to(x.device))[None, None].expand_as(x).clone()
        eps[0, special] = 1e-12  # special tokens stay where they are
        with torch.no_grad():
            probs = module(x)[0].double().cpu().numpy()
        out = pick_target(model, target, probs)
        unlearned, unlearning_evals, unlearned_ok = unlearned_output(module, x, out, options)
        xp, kls = match_baseline(module, x, unlearned, eps, options)
        xp = torch.where(special[None, :, None], x, xp)
        tokens = token_values(
            hook, x[0], xp[0], types, out, alphas, weights, options.output, model.max_batch_bytes
        )
        with torch.no_grad():
            ends = hook.scores(torch.cat([x, xp]), types.expand(2, -1), options.output)
            p_x, p_base = module(torch.cat([x, xp]))[:, out].tolist()
        p_copy = float(unlearned[0, out].exp())
        share = (p_x - p_base) / (p_x - p_copy) if p_x - p_copy > 1e-12 else 0.0
        e = explanation_of(str(text), tokens, offsets, special_l, ends.double().cpu().numpy(), out)
        details = {
            **(e.details or {}),
            "probability_input": p_x,
            "probability_baseline": p_base,
            "unlearned_probability": p_copy,
            "match_share": share,
            "kl_start": kls[0],
            "kl_final": min(kls[1:]) if len(kls) > 1 else kls[0],
        }
        explanations.append(
            replace(
                e,
                n_model_evals=unlearning_evals + options.pgd_steps + 1 + options.ig_steps + 2,
                estimator=f"uni-ig-{options.method}",
                details=details,
                warnings=_caveats(options, unlearned_ok, p_x, p_copy, p_base, share),
            )
        )
    additive = all(e.details and e.details["unassigned"] == 0.0 for e in explanations)
    return ExplainResult(tuple(explanations), (), echo, cost, additive)
