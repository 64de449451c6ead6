"""Own time of the gp estimator's fit (issue 17), one thread.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/gp_own_time.py [--gp-file /tmp/gp_old.py]

`--gp-file` times another copy of gp.py, e.g. an older one from
`git show REV:explainers/estimators/gp.py > /tmp/gp_old.py` (its imports must still resolve).
The alternatives of gp's misfit rule were compared by bench/gp_variants_bench.py, at commit
a1c3eee (the rule kept is the one gp.py has).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from explainers.estimators import gp  # noqa: E402


def own_time(path: Path | None, repeats: int = 5) -> None:
    """Seconds of gp's fit (best of `repeats`) at 256, 1024 and 2048 coalitions, 16 and 30
    players, on a tanh-MLP game of two outputs (KernelSHAP's plan, seed 0)."""
    import importlib.util

    from explainers.estimators import kernel

    module: Any = gp
    if path is not None:
        spec = importlib.util.spec_from_file_location("gp_other", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    print("| players | coalitions | fit s |\n|---|---|---|")
    for n in (16, 30):
        rng = np.random.default_rng(0)
        w1, w2 = rng.normal(size=(n, 32)) * 2 / np.sqrt(n), rng.normal(size=(32, 2))
        for m in (256, 1024, 2048):
            planner = kernel.Planner(n, "kernel", np.random.default_rng(0))
            planner.extend(m)
            plan = planner.design()
            v = np.tanh(plan.masks.astype(np.float64) @ w1 - 0.5) @ w2
            y = v - v[0]
            seconds = []
            for _ in range(repeats + 1):
                t0 = time.perf_counter()
                module._fit(plan, y, y[1].copy())
                seconds.append(time.perf_counter() - t0)
            print(f"| {n} | {m} | {min(seconds[1:]):.3f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gp-file", type=Path, help="another gp.py to time")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    own_time(args.gp_file, args.repeats)


if __name__ == "__main__":
    main()
