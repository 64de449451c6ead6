"""GPU benchmark (issue 20): the same explanations on the CPU and on a CUDA device.

    .venv/bin/python bench/gpu_bench.py [--quick] [--devices cpu,cuda] [--out results.json]

Each section runs once per device after one warm-up call (CUDA kernels, allocator) and
compares the device's values with the CPU's (max |difference|):
1. exact Shapley on digits-cnn: patches of 2x2 pixels (16 players, 65,536 coalitions), each
   coalition averaged over `--background` rows of the training split: 65,536 x r model rows per
   image, passed in batches of `Model.rows_per_pass()` rows (on CUDA: what fits in half the free
   device memory; on the CPU: the model's batch_size, 16,384).
2. kernel Shapley on digits-cnn: one player per pixel (64), `--kernel-budget` coalitions.
3. integrated gradients on digits-cnn: expected gradients over `--ig-baselines` background
   rows, `--ig-steps` steps, `--ig-batch` rows per forward/backward pass.
4. AttriBoT exact leave-one-out on gemma3-270m: the first `--lm-paragraphs` paragraphs of
   bench/attribot.py's context (5 sentences each), its query and fixed response.
Without a CUDA device it says "no CUDA device" and prints the CPU numbers. Sizes default to a
GPU-sized run; --quick shrinks them to a CPU-friendly minute or so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from app.settings import Settings  # noqa: E402
from explainers.gradients import integrated as gradients  # noqa: E402
from explainers.masking import MaskerOptions  # noqa: E402
from explainers.shapley import explainer as shapley  # noqa: E402
from models.base import Model  # noqa: E402
from models.device import place, resolve_device  # noqa: E402
from models.registry import ModelRegistry  # noqa: E402

QUICK = {
    "instances": 1,
    "background": 2,
    "kernel_budget": 4096,
    "kernel_background": 8,
    "ig_steps": 32,
    "ig_baselines": 8,
    "lm_paragraphs": 1,
}
FULL = {
    "instances": 4,
    "background": 64,
    "kernel_budget": 32768,
    "kernel_background": 64,
    "ig_steps": 256,
    "ig_baselines": 64,
    "lm_paragraphs": 6,
}


def timed(fn: Callable[[], Any], device: torch.device) -> tuple[Any, float]:
    """(result, seconds) of one call after a warm-up call."""
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, time.perf_counter() - start


def values(result: Any) -> np.ndarray:
    return np.stack([np.asarray(e.values, dtype=np.float64) for e in result.explanations])


def digits_sections(
    model: Model, args: argparse.Namespace
) -> dict[str, tuple[np.ndarray, float, int]]:
    """name -> (values [m, players], seconds, model rows) for the digits-cnn sections."""
    assert model.reference is not None and model.background is not None
    x = model.reference[1000 : 1000 + args.instances]
    out: dict[str, tuple[np.ndarray, float, int]] = {}

    bg = model.background[: args.background]
    exact = shapley.ShapleyOptions(
        estimator="exact", patch_size=2, masker=MaskerOptions(type="background")
    )
    result, seconds = timed(
        lambda: shapley.explain(model, x, options=exact, target=3, background=bg), model.device
    )
    rows = len(x) * (1 << 16) * len(bg)
    out["exact shapley (16 patches)"] = (values(result), seconds, rows)
    # The floor: the same number of rows through model.predict alone (prebuilt, one call per
    # image), so the rest of the exact time is building masked rows and the transform.
    prebuilt = np.repeat(x[:1], (1 << 16) * len(bg), axis=0)
    probs, seconds = timed(lambda: np.stack([model.predict(prebuilt) for _ in x]), model.device)
    out["  model.predict alone"] = (probs[:, :1, 3], seconds, rows)

    bg = model.background[: args.kernel_background]
    kernel = shapley.ShapleyOptions(
        estimator="kernel", patch_size=1, masker=MaskerOptions(type="background")
    )
    budget = args.kernel_budget * len(bg)
    result, seconds = timed(
        lambda: shapley.explain(
            model, x, options=kernel, target=3, background=bg, budget=budget, seed=0
        ),
        model.device,
    )
    rows = sum(e.n_model_evals for e in result.explanations)
    out["kernel shapley (64 pixels)"] = (values(result), seconds, rows)

    ig = gradients.IntegratedGradientsOptions(
        baseline="expected",
        n_baselines=args.ig_baselines,
        steps=args.ig_steps,
        batch_size=args.ig_batch or (65536 if model.device.type == "cuda" else 1024),
    )
    result, seconds = timed(
        lambda: gradients.explain(model, x, options=ig, target=3, seed=0), model.device
    )
    out["integrated gradients"] = (values(result), seconds, result.budget * len(x))
    return out


def lm_section(
    device: torch.device, paragraphs: int, model_dir: Path
) -> tuple[np.ndarray, float, int]:
    """AttriBoT exact LOO on gemma3-270m on `device`: (values, seconds, sequences run)."""
    from bench.attribot import PARAGRAPHS, QUERY, RESPONSE
    from explainers.attribot import AttriBoTOptions, attribute
    from models.builtin.lm import shared_language_model

    lm = place(shared_language_model("gemma3-270m", model_dir), device)  # the one shared copy
    opts = AttriBoTOptions(method="loo")
    (e, _), seconds = timed(
        lambda: attribute(lm, PARAGRAPHS[:paragraphs], QUERY, RESPONSE, opts), device
    )
    assert e.details is not None
    passes = e.details["forward_passes"]  # per model name (older versions: a number)
    total = sum(passes.values()) if isinstance(passes, dict) else int(passes)
    return np.asarray(e.values, dtype=np.float64)[None], seconds, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CPU-sized run (about a minute)")
    parser.add_argument("--devices", default="cpu,cuda", help="comma-separated; default cpu,cuda")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    for name, value in FULL.items():
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=int,
            default=None,
            help=f"default {value} (--quick: {QUICK[name]})",
        )
    parser.add_argument("--ig-batch", type=int, default=None, help="default 1024 (cuda: 65536)")
    parser.add_argument("--skip-lm", action="store_true", help="no AttriBoT section")
    parser.add_argument("--out", type=Path, default=None, help="JSON results")
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    for name, value in sizes.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    torch.set_num_threads(args.threads)
    model_dir = Settings().model_dir

    devices: list[torch.device] = []
    for spec in args.devices.split(","):
        if spec.strip().startswith("cuda") and not torch.cuda.is_available():
            print(f"no CUDA device ({spec.strip()} skipped): CPU numbers only", flush=True)
            continue
        devices.append(resolve_device(spec))
    print(
        f"torch {torch.__version__} ({platform.processor() or platform.machine()}, "
        f"{args.threads} CPU thread(s)); devices: {[str(d) for d in devices]}",
        flush=True,
    )
    if torch.cuda.is_available():
        print(f"CUDA device: {torch.cuda.get_device_name(0)}", flush=True)
    sizes_used = {k: getattr(args, k) for k in sizes}
    print("sizes:", sizes_used, f"load average {os.getloadavg()[0]:.1f}", flush=True)

    results: dict[str, dict[str, Any]] = {}
    reference: dict[str, np.ndarray] = {}

    def record(
        section: str, device: torch.device, v: np.ndarray, s: float, rows: int, unit: str = "rows"
    ) -> None:
        row = {"seconds": round(s, 4), unit: rows, f"{unit}_per_s": round(rows / s, 1)}
        if section in reference:
            row["max_abs_diff_vs_first"] = float(np.abs(v - reference[section]).max())
            first = next(iter(results[section].values()))
            row["speedup_vs_first"] = round(first["seconds"] / s, 2)
        else:
            reference[section] = v
        results.setdefault(section, {})[str(device)] = row
        print(
            f"{section:30s} {device!s:7s} {s:9.3f} s  {rows:>11,d} {unit:9s} "
            f"{rows / s:>13,.1f} {unit}/s"
            + (
                f"  x{row['speedup_vs_first']:.1f}, max |diff| {row['max_abs_diff_vs_first']:.1e}"
                if "speedup_vs_first" in row
                else ""
            ),
            flush=True,
        )

    for device in devices:
        model = ModelRegistry(model_dir, device=device).get("digits-cnn")
        print(
            f"digits-cnn on {device}: batch_size {model.batch_size}, rows per pass "
            f"{model.rows_per_pass()}, row_bytes {model.row_bytes}",
            flush=True,
        )
        for section, (v, s, rows) in digits_sections(model, args).items():
            record(section, device, v, s, rows)
    if not args.skip_lm:  # CPU first: moving the shared LM to CUDA moves it for good
        for device in devices:
            v, s, passes = lm_section(device, args.lm_paragraphs, model_dir)
            record("attribot exact LOO (gemma3)", device, v, s, passes, "sequences")
    if args.out:
        args.out.write_text(
            json.dumps(
                {"sizes": sizes_used, "devices": [str(d) for d in devices], "results": results},
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
