"""Per-call overhead of the model worker hop (models/sandbox/): the same model's predict in
process and in its worker, on a TorchScript MLP and an XGBoost booster, at 1, 64 and 4096
rows per call; and the time of one registration both ways (the zygote's one-time start apart).

    .venv/bin/python bench/sandbox_bench.py [--out /tmp/bench_sandbox.md] [--repeat 50]
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.adapters.user import register
from models.declaration import Declaration
from models.sandbox import sandboxed_register

N_FEATURES = 32


def _declaration(fmt: str, name: str) -> Declaration:
    return Declaration(name, "tabular", "classification", (N_FEATURES,), ("no", "yes"),
                       tuple(f"x{i}" for i in range(N_FEATURES)), format=fmt)  # fmt: skip


def torchscript_mlp() -> bytes:
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(N_FEATURES, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
        torch.nn.ReLU(), torch.nn.Linear(128, 2), torch.nn.Softmax(dim=1),
    )  # fmt: skip
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(net.eval()), buf)
    return buf.getvalue()


def xgboost_booster() -> bytes:
    import xgboost as xgb

    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, N_FEATURES))
    y = (x[:, 0] + x[:, 1] * x[:, 2] > 0).astype(int)
    params = {"objective": "binary:logistic", "max_depth": 6, "nthread": 1}
    return bytes(xgb.train(params, xgb.DMatrix(x, y), 100).save_raw("json"))


def per_call(fn: Callable[[], object], repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="/tmp/bench_sandbox.md")
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(1)
    lines = [
        "| model | rows per call | in process (ms) | worker (ms) | ratio | overhead (ms) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    reg_lines = []
    start = time.perf_counter()
    sandboxed_register(_declaration("torchscript", "warm"), {"model": torchscript_mlp()})
    zygote = time.perf_counter() - start
    for label, fmt, data in (
        ("TorchScript MLP 32-128-128-2", "torchscript", torchscript_mlp()),
        ("XGBoost 100 trees depth 6", "xgboost", xgboost_booster()),
    ):
        decl = _declaration(fmt, fmt)
        t0 = time.perf_counter()
        local, _ = register(decl, {"model": data})
        t1 = time.perf_counter()
        remote, _ = sandboxed_register(decl, {"model": data})
        t2 = time.perf_counter()
        reg_lines.append(f"| {label} | {1e3 * (t1 - t0):.0f} | {1e3 * (t2 - t1):.0f} |")
        for rows in (1, 64, 4096):
            x = rng.normal(size=(rows, N_FEATURES)).astype(np.float32)
            np.testing.assert_allclose(remote.predict(x), local.predict(x), rtol=1e-5, atol=1e-6)
            a = per_call(lambda x=x, m=local: m.predict(x), args.repeat)
            b = per_call(lambda x=x, m=remote: m.predict(x), args.repeat)
            lines.append(
                f"| {label} | {rows} | {1e3 * a:.3f} | {1e3 * b:.3f} | {b / a:.2f} | "
                f"{1e3 * (b - a):.3f} |"
            )
            print(lines[-1], flush=True)
    text = "\n".join(
        [
            "## Model worker hop (bench/sandbox_bench.py)",
            "",
            f"Median of {args.repeat} calls of `Model.predict`, one torch thread, "
            f"{torch.get_num_threads()} thread in process, TORCH_THREADS=1 in the worker.",
            "",
            *lines,
            "",
            "One registration (build, checks, test passes, memory probe), milliseconds:",
            "",
            "| model | in process | in a fresh worker |",
            "|---|---:|---:|",
            *reg_lines,
            "",
            f"The workers' zygote starts once per server process: {zygote:.1f} s here "
            "(imports torch, xgboost, lightgbm, onnxruntime, shap; warms each format up).",
            "",
            "Reproduce: `.venv/bin/python bench/sandbox_bench.py`",
        ]
    )
    Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
