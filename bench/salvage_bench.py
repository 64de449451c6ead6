"""Salvage vs the squared-error objective vs KernelSHAP on digits-cnn (16 patch players).

Ground truth: exact Shapley values (all 2^16 coalitions) of the game the explainers are trained
on, v(S) = surrogate(x with absent patches zeroed), in each objective's units: centred
log-probabilities (distribution objective) or probabilities (squared error). KernelSHAP runs
on the same game at budgets 64..1024. Every method's error is reported in both units where it
has values in them: the distribution objective's explainer defines a probability for every
coalition, softmax(phi_0 + sum_{i in S} psi_i), so its probability-unit values are the exact
Shapley values of that implied game; the squared objective's additive probabilities have no
logarithm when they leave (0, 1], so it has none in log-probability units. Faithfulness:
insertion and deletion AUC of the classifier's probability of the explained class when patches
are added / removed in the order of the attributions. Time per explanation: one image at a
time, and 100 images in one call.

    .venv/bin/python -m bench.salvage_bench [--images 40] [--epochs 40] [--seed 0] \
        [--configs distribution/informed,distribution/uncentred,distribution/informed/T2,...]
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from app.settings import Settings
from explainers.amortized.salvage import inference as salvage_inference
from explainers.amortized.salvage import train as salvage
from explainers.games.masked import patch_groups
from explainers.shapley.explainer import shapley_values
from models.base import Model
from models.builtin.trained import dataset_split, load_digits_cnn

N = 16
BUDGETS = (64, 128, 256, 512, 1024)
UNITS = {"distribution": slice(0, 10), "squared": slice(10, 20)}
UNIT_NAMES = {"distribution": "centred log-prob", "squared": "probability"}
DEFAULT_CONFIGS = (
    "distribution/informed,distribution/kernel,distribution/uniform,squared/informed,squared/kernel"
)


@contextlib.contextmanager
def uncentred_sampler() -> Iterator[None]:
    """The informed sampler before issue 15: z = scores / std, not centred (for comparison)."""
    original = salvage.sample_masks

    def old(kind, n, batch, pairs, gen, scores=None, beta=1.0, informed_fraction=0.5):  # type: ignore[no-untyped-def]
        if kind == "informed" and scores is not None:
            scores = scores / (scores.std(dim=1, keepdim=True) + 1e-8)
            n_inf = round(informed_fraction * pairs)
            prob = torch.sigmoid(beta * scores)[:, None, :].expand(batch, n_inf, n)
            informed = torch.rand(batch, n_inf, n, generator=gen) < prob
            rest = salvage.kernel_masks(n, batch * (pairs - n_inf), gen)
            half = torch.cat([informed, rest.reshape(batch, pairs - n_inf, n)], dim=1)
            return torch.stack([half, ~half], dim=2).reshape(batch, 2 * pairs, n)
        return original(kind, n, batch, pairs, gen, scores, beta, informed_fraction)

    salvage.sample_masks = old  # type: ignore[assignment]
    try:
        yield
    finally:
        salvage.sample_masks = original  # type: ignore[assignment]


def implied_probability_game(trained: salvage.Trained, x: np.ndarray) -> Any:
    """The distribution explainer's own game in probabilities: S -> softmax(phi_0 + psi(S)).
    masks [m, n] -> [m, 20] (probabilities in the second half, as in both_units)."""
    xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))[None]
    with torch.inference_mode():
        psi = salvage.centred(trained.explainer(xt))[0].double()  # [n, C]
    phi0 = salvage.centred(torch.from_numpy(trained.empty_logp)).double()

    def game(masks: np.ndarray) -> np.ndarray:
        m = torch.from_numpy(np.asarray(masks, dtype=np.float64))
        probs = torch.softmax(phi0[None] + m @ psi, dim=1)
        return torch.cat([torch.zeros_like(probs), probs], dim=1).numpy()

    return game


def both_units(trained: salvage.Trained, x: np.ndarray) -> Any:
    """The surrogate game in both units at once: masks -> [m, 20] (CLR, probabilities)."""
    xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))[None]
    groups = torch.from_numpy(trained.groups.copy())

    def game(masks: np.ndarray) -> np.ndarray:
        mt = torch.from_numpy(np.asarray(masks, dtype=bool))[None]
        with torch.inference_mode():
            logp = salvage.log_probs(trained.surrogate, salvage.masked(xt, mt, groups))
        out = torch.cat([salvage.centred(logp), logp.exp()], dim=1)
        return out.numpy().astype(np.float64)

    return game


def auc_curves(model: Model, x: np.ndarray, values: np.ndarray, c: int) -> tuple[float, float]:
    """Insertion and deletion AUC (trapezoid over the fraction of patches, 17 points)."""
    groups = patch_groups(model.input_shape, 2)[0]
    order = np.argsort(-values, kind="stable")
    steps = np.zeros((N + 1, N), dtype=bool)
    for k in range(1, N + 1):
        steps[k, order[:k]] = True
    rows = []
    for masks in (steps, ~steps):  # insertion: add the most important first; deletion: remove
        rows.append(x.reshape(-1)[None] * masks[:, groups])
    probs = model.predict(np.concatenate(rows).reshape(-1, *model.input_shape))[:, c]
    frac = np.linspace(0, 1, N + 1)
    return float(np.trapezoid(probs[: N + 1], frac)), float(np.trapezoid(probs[N + 1 :], frac))


def accuracy(est: np.ndarray, exact: np.ndarray) -> tuple[float, float]:
    """Relative L2 error and Pearson correlation of one explanation."""
    err = float(np.linalg.norm(est - exact)) / max(float(np.linalg.norm(exact)), 1e-12)
    return err, float(np.corrcoef(est, exact)[0, 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--images", type=int, default=40)
    parser.add_argument("--epochs", type=int, default=40, help="explainer epochs per config")
    parser.add_argument("--surrogate-epochs", type=int, default=8)
    parser.add_argument("--pairs", type=int, default=8, help="mask/complement pairs per image")
    parser.add_argument("--only", default=None, help="one configuration: objective/sampler")
    parser.add_argument(
        "--configs",
        default=DEFAULT_CONFIGS,
        help="comma-separated objective/sampler[/T<temperature>]; sampler `uncentred` is the "
        "informed sampler before issue 15 (z = scores / std)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the service uses 1)")
    parser.add_argument("--seed", type=int, default=0, help="training seed of every config")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = load_digits_cnn(Settings().model_dir)
    x_test = dataset_split("digits-cnn").x_test
    images = x_test[: args.images]

    configs = [tuple(c.strip().split("/")) for c in (args.only or args.configs).split(",")]
    trained: dict[tuple[str, ...], salvage.Trained] = {}
    surrogate = None
    for config in configs:
        objective, sampler = config[0], config[1]
        temperature = float(config[2][1:]) if len(config) > 2 else 1.0
        opts = salvage.SalvageTrainOptions(
            objective=objective,  # type: ignore[arg-type]
            sampler="informed" if sampler == "uncentred" else sampler,  # type: ignore[arg-type]
            explainer_epochs=args.epochs,
            pairs=args.pairs,
            surrogate_epochs=args.surrogate_epochs,
            temperature=temperature,
            seed=args.seed,
        )
        t = time.perf_counter()
        with uncentred_sampler() if sampler == "uncentred" else contextlib.nullcontext():
            out = salvage.train(model, opts, surrogate=surrogate)
        assert out is not None
        trained[config] = out
        surrogate = out.surrogate
        print(
            f"trained {'/'.join(config):28s} in {time.perf_counter() - t:6.1f} s "
            f"(held-out {out.metrics})",
            flush=True,
        )
    first = trained[configs[0]]  # every config shares this surrogate, so one game

    # Ground truth and KernelSHAP per image, both units in one pass.
    exact: list[np.ndarray] = []
    kernel: dict[int, list[np.ndarray]] = {b: [] for b in BUDGETS}
    classes: list[int] = []
    t_exact = time.perf_counter()
    for j, x in enumerate(images):
        game = both_units(first, x)
        est = shapley_values(game, N, estimator="exact")
        exact.append(est.values)
        classes.append(int(np.argmax(est.full_value[10:])))
        for b in BUDGETS:
            kernel[b].append(shapley_values(game, N, estimator="kernel", budget=b, seed=j).values)
    print(f"exact + kernel ground work: {time.perf_counter() - t_exact:.1f} s", flush=True)

    def rows_for(name: str, units: str, est_of: Any) -> dict[str, Any]:
        sl = UNITS[units]
        errs, cors, ins, dels = [], [], [], []
        for j, x in enumerate(images):
            c = classes[j]
            est = est_of(j)[:, sl][:, c]
            e, r = accuracy(est, exact[j][:, sl][:, c])
            a, d = auc_curves(model, x, est, c)
            errs.append(e)
            cors.append(r)
            ins.append(a)
            dels.append(d)
        return {
            "method": name,
            "units": UNIT_NAMES[units],
            "rel_err": np.mean(errs),
            "corr": np.mean(cors),
            "ins": np.mean(ins),
            "del": np.mean(dels),
        }

    table = []
    for config, tr in trained.items():
        values = salvage_inference.amortized(tr, images).values
        full = np.zeros((len(images), N, 20))
        full[:, :, UNITS[config[0]]] = values
        name = f"salvage {'/'.join(config)}"
        table.append(rows_for(name, config[0], lambda j, f=full: f[j]))
        if config[0] == "distribution":  # its implied probabilities, exact Shapley values
            implied = [
                shapley_values(implied_probability_game(tr, x), N, estimator="exact").values
                for x in images
            ]
            table.append(rows_for(name + " (implied)", "squared", lambda j, v=implied: v[j]))
    for units in UNITS:
        for b in BUDGETS:
            table.append(rows_for(f"kernelshap {b}", units, lambda j, b=b: kernel[b][j]))
        table.append(rows_for("exact", units, lambda j: exact[j]))
    print("\n| method | units | rel. L2 error | Pearson r | insertion AUC | deletion AUC |")
    print("|---|---|---|---|---|---|")
    for row in table:
        print(
            f"| {row['method']} | {row['units']} | {row['rel_err']:.3f} | {row['corr']:.3f} | "
            f"{row['ins']:.3f} | {row['del']:.3f} |"
        )

    # Time per explanation.
    batch = x_test[:100]
    timing = []
    for key in {c[0]: c for c in reversed(configs)}.values():  # one config per objective
        tr = trained[key]
        salvage_inference.amortized(tr, batch[:1])  # warm up
        t = time.perf_counter()
        for x in batch:
            salvage_inference.amortized(tr, x[None])
        one = (time.perf_counter() - t) / len(batch)
        t = time.perf_counter()
        salvage_inference.amortized(tr, batch)
        batched = (time.perf_counter() - t) / len(batch)
        timing.append((f"salvage {'/'.join(key)}", one, batched))
    for b in (64, 256, 1024):
        t = time.perf_counter()
        for j, x in enumerate(batch):
            shapley_values(both_units(first, x), N, estimator="kernel", budget=b, seed=j)
        per = (time.perf_counter() - t) / len(batch)
        timing.append((f"kernelshap {b}", per, per))
    print("\n| method | ms per image, one at a time | ms per image, 100 in one call |")
    print("|---|---|---|")
    for name, one, batched in timing:
        print(f"| {name} | {one * 1000:.3f} | {batched * 1000:.3f} |")
    k256 = next(t for t in timing if t[0] == "kernelshap 256")
    for name, one, batched in timing[: len(timing) - 3]:
        print(
            f"{name}: {k256[1] / one:.0f}x faster than KernelSHAP-256 one at a time, "
            f"{k256[2] / batched:.0f}x batched"
        )


if __name__ == "__main__":
    main()
