"""gp's own time (issue 30): the fit given recorded values, one thread, and its values against a
stored baseline.

    OMP_NUM_THREADS=1 .venv/bin/python bench/gp_speed_bench.py [--compare REV] [--save-base]

The game is a tanh MLP of two outputs in closed form (bench/gp_own_time.py's), evaluated on
KernelSHAP's plan (seed 0) before any timing: the seconds are gp._fit alone (the marginal
likelihood's grid, the posterior, the halves, the regression adjustment and the KernelSHAP
references), at 16 and 30 players and 512, 1,024 and 2,048 coalitions, the median of
`--repeats` fits after one warm-up, with BLAS and OpenMP limited to one thread: CPU seconds of
the process (time.process_time; one thread, so close to wall time on an idle core, and less
inflated than wall time on a shared machine), wall seconds beside them.

`--compare REV` times REV's explainers/ and models/ (`git archive`, in a temporary directory)
and the working tree alternately, `--rounds` times each (the machine is shared: alternation
spreads the load over both), prints both and their ratio, and checks the working tree's values
against REV's: max |delta phi| / max |phi|, max relative delta of error_std, and whether the
prior's choice (relevances, theta, gamma, nugget, the leave-one-out ratio) is the same.
REV's values are saved as bench/out/gp_speed_base.npz (git-ignored); without `--compare`, the
working tree alone is timed and checked against that file when it exists (`--save-base`:
write the working tree's values there instead).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "bench" / "out" / "gp_speed_base.npz"
CONFIGS = [(n, m) for n in (16, 30) for m in (512, 1024, 2048)]
THREADS = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def worker(root: Path, repeats: int, values: Path) -> None:
    """Time gp._fit from `root`'s explainers/ on every config; print {config: [seconds]} as
    JSON and save the values and the prior's choice to `values` (npz)."""
    sys.path.insert(0, str(root))
    import time

    import numpy as np
    from threadpoolctl import threadpool_limits

    from explainers.estimators import gp, gp_prior, kernel

    assert Path(gp.__file__).resolve().is_relative_to(root.resolve()), gp.__file__
    seconds: dict[str, list[float]] = {}
    saved: dict[str, Any] = {}
    with threadpool_limits(1):
        for n, m in CONFIGS:
            rng = np.random.default_rng(0)
            w1, w2 = rng.normal(size=(n, 32)) * 2 / np.sqrt(n), rng.normal(size=(32, 2))
            planner = kernel.Planner(n, "kernel", np.random.default_rng(0))
            planner.extend(m)
            plan = planner.design()
            v = np.tanh(plan.masks.astype(np.float64) @ w1 - 0.5) @ w2
            y = v - v[0]
            times, walls = [], []
            for _ in range(repeats + 1):
                t0, w0 = time.process_time(), time.perf_counter()
                phi, std = gp._fit(plan, y, y[1].copy())
                times.append(time.process_time() - t0)
                walls.append(time.perf_counter() - w0)
            seconds[f"{n}:{m}"], seconds[f"{n}:{m}:wall"] = times[1:], walls[1:]
            prior, nugget, inflate = gp_prior._choose(plan.masks[1:].astype(np.float64), y[1:])
            key = f"n{n}_m{m}"
            assert std is not None
            saved[f"{key}_phi"], saved[f"{key}_std"] = phi, std
            saved[f"{key}_prior"] = np.concatenate(
                [prior.q, [prior.theta, prior.gamma, nugget], inflate]
            )
    np.savez(values, **saved)
    print(json.dumps(seconds))


def run_worker(root: Path, repeats: int, values: Path) -> dict[str, list[float]]:
    out = subprocess.run(
        [sys.executable, __file__, "--worker", str(root), "--repeats", str(repeats),
         "--values", str(values)],
        env={**os.environ, **THREADS}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    result: dict[str, list[float]] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def compare_values(base: Path, new: Path) -> list[str]:
    """One line per config: max |delta phi| / max |phi|, max relative delta of error_std and
    the largest relative change in the prior's choice (0 where it is the same)."""
    import numpy as np

    a, b = np.load(base), np.load(new)
    lines = []
    for n, m in CONFIGS:
        key = f"n{n}_m{m}"
        if f"{key}_phi" not in a.files:
            continue
        phi0, phi1 = a[f"{key}_phi"], b[f"{key}_phi"]
        std0, std1 = a[f"{key}_std"], b[f"{key}_std"]
        pr0, pr1 = a[f"{key}_prior"], b[f"{key}_prior"]
        dphi = float(np.abs(phi1 - phi0).max() / np.abs(phi0).max())
        dstd = float((np.abs(std1 - std0) / std0).max())
        dprior = float((np.abs(pr1 - pr0) / np.abs(pr0)).max())
        lines.append(f"| {n} | {m} | {dphi:.1e} | {dstd:.1e} | {dprior:.1e} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--compare", metavar="REV", help="also time REV, alternately")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--save-base", action="store_true")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--values", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.repeats, args.values)
        return
    import numpy as np

    BASE.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        roots = {"now": ROOT}
        if args.compare:
            old = Path(tmp) / "base"
            old.mkdir()
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", args.compare, "explainers", "models"],
                capture_output=True,
                check=True,
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
            roots = {"base": old, "now": ROOT}
        times: dict[str, dict[str, list[float]]] = {name: {} for name in roots}
        values = {name: Path(tmp) / f"{name}.npz" for name in roots}
        for r in range(args.rounds):
            for name in list(roots)[:: 1 if r % 2 == 0 else -1]:
                for key, secs in run_worker(roots[name], args.repeats, values[name]).items():
                    times[name].setdefault(key, []).extend(secs)
        if args.compare:
            BASE.write_bytes(values["base"].read_bytes())
        elif args.save_base:
            BASE.write_bytes(values["now"].read_bytes())
        med: dict[str, Any] = {
            name: {key: float(np.median(s)) for key, s in t.items()} for name, t in times.items()
        }
        print(f"{args.rounds} rounds x {args.repeats} fits, median seconds, one thread")
        if args.compare:
            print(
                f"| players | coalitions | {args.compare} cpu s | now cpu s | ratio "
                f"| {args.compare} wall s | now wall s |\n|---|---|---|---|---|---|---|"
            )
            for n, m in CONFIGS:
                b, c = med["base"][f"{n}:{m}"], med["now"][f"{n}:{m}"]
                bw, cw = med["base"][f"{n}:{m}:wall"], med["now"][f"{n}:{m}:wall"]
                print(f"| {n} | {m} | {b:.3f} | {c:.3f} | {b / c:.2f}x | {bw:.3f} | {cw:.3f} |")
        else:
            print("| players | coalitions | cpu s | wall s |\n|---|---|---|---|")
            for n, m in CONFIGS:
                c, cw = med["now"][f"{n}:{m}"], med["now"][f"{n}:{m}:wall"]
                print(f"| {n} | {m} | {c:.3f} | {cw:.3f} |")
        if BASE.exists() and not args.save_base:
            print(
                f"\nvalues against {BASE.relative_to(ROOT)}"
                + (f" ({args.compare})" if args.compare else "")
                + "\n| players | coalitions | max dphi / max phi | max rel d error_std "
                "| max rel d prior |\n|---|---|---|---|---|"
            )
            print("\n".join(compare_values(BASE, values["now"])))


if __name__ == "__main__":
    main()
