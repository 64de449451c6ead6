"""One 3x224x224 image on a small CNN: our Shapley and partition (Owen) values against shap's
PartitionExplainer with its blur masker, and our integrated gradients against captum's.

Model: tests/image_models.py `rgb_cnn(3, 224, 5, width, seed=0)` (random weights, softmax),
image `images(1, 3, 224, seed=0)`, the predicted class explained.
- ours: the service's `shapley` explainer as a library, defaults for images (patches of 14 px:
  16x16 = 256 players, absence a Gaussian blur of sigma 5 px): `auto` at the default budget
  (2n + 2048 = 2560 coalitions) and `partition` (Owen values over the spatial halving
  hierarchy) at the same evaluations as shap.
- shap: PartitionExplainer over shap.maskers.Image with a box blur of 17 px (the standard
  deviation of our sigma-5 Gaussian): the array of cv2.blur(x, (17, 17)) given as mask_value,
  which is what "blur(17,17)" fills masked pixels with (opencv is not installed here; scipy's
  uniform_filter with mode "mirror" is cv2's default border). Its players are the 150,528
  pixel-channels; its values are summed per 14x14 patch for the error.
- error: relative L2 distance (over the 256 patches, explained class) to the same method's
  answer at a higher budget (`--reference`; kernel at `--shapley-reference` for Shapley) —
  a measure of how far each answer is from converged under its own game, not from each other.
- memory: the rise of VmHWM over the resident size before each run (/proc/self/clear_refs
  reset between runs; tracemalloc does not see torch).
- integrated gradients: explainers/gradients/integrated.py against captum.attr.IntegratedGradients,
  zero baseline, 50 Gauss-Legendre steps, the class probability.

    .venv/bin/python bench/image_bench.py --quick   # width 4, references 3x / 4096: ~4-5 min
    .venv/bin/python bench/image_bench.py           # width 16, references 8x / 16384 (kernel)
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from explainers.games.masked import patch_groups
from explainers.gradients import integrated as gradients
from explainers.shapley import explainer as shapley
from models.base import Model
from models.device import place
from tests import image_models as im

SIZE, CLASSES, PATCH, BOX = 224, 5, 14, 17


def status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def measure(run: Callable[[], Any]) -> tuple[Any, float, float]:
    """(result, seconds, MB of peak resident memory above the resident size before)."""
    gc.collect()
    before = status_kb("VmRSS")
    try:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        reset = True
    except OSError:
        reset = False
    t0 = time.perf_counter()
    out = run()
    took = time.perf_counter() - t0
    peak = status_kb("VmHWM")
    return out, took, (peak - before) / 1024 if reset else float("nan")


class Counted(torch.nn.Module):
    """The CNN, counting the rows it is given (every explainer's model evaluations)."""

    def __init__(self, body: torch.nn.Module) -> None:
        super().__init__()
        self.body = body
        self.rows = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.rows += int(x.shape[0])
        return self.body(x)


def make_model(width: int) -> tuple[Model, Counted]:
    counted = Counted(im.rgb_cnn(3, SIZE, CLASSES, width=width, seed=0)).eval()
    model = Model(
        name=f"rgb-cnn-{SIZE}",
        modality="image",
        task="classification",
        input_shape=(3, SIZE, SIZE),
        feature_names=tuple(f"x{i}" for i in range(3 * SIZE * SIZE)),
        output_names=tuple(f"class_{i}" for i in range(CLASSES)),
        module=counted,
        input_range=(0.0, 1.0),
    )
    # Placed as the server places it: rows per call measured against MAX_BATCH_BYTES (256 MiB).
    model = place(model, torch.device("cpu"))
    counted.rows = 0  # the placement's probe rows are not an explainer's evaluations
    return model, counted


def ours(
    model: Model, x: np.ndarray, estimator: str, budget: int | None, seed: int = 0
) -> dict[str, Any]:
    options = shapley.ShapleyOptions.model_validate({"estimator": estimator})
    res = shapley.explain(model, x[None], options=options, budget=budget, seed=seed)
    (e,) = res.explanations
    return {
        "values": np.asarray(e.values, dtype=np.float64),
        "evals": e.n_model_evals,
        "estimator": e.estimator,
        "exact": e.exact,
        "cls": e.output_index,
        "gap": e.approximation_error,
        "patch": res.parameters.get("patch_size"),
        "warnings": [w.code for w in e.warnings],
    }


def box_blur(hwc: np.ndarray) -> np.ndarray:
    """cv2.blur(x, (BOX, BOX)) with cv2's default border (reflect 101 = scipy's mirror)."""
    from scipy.ndimage import uniform_filter

    return np.asarray(uniform_filter(hwc, size=(BOX, BOX, 1), mode="mirror"))


def theirs(counted: Counted, x: np.ndarray, cls: int, max_evals: int) -> dict[str, Any]:
    import shap

    hwc = np.ascontiguousarray(x.transpose(1, 2, 0)).astype(np.float64)

    def f(batch: np.ndarray) -> np.ndarray:
        t = torch.tensor(np.asarray(batch).transpose(0, 3, 1, 2), dtype=torch.float32)
        with torch.no_grad():
            return counted(t).double().numpy()

    masker = shap.maskers.Image(box_blur(hwc), hwc.shape)
    explainer = shap.PartitionExplainer(f, masker)
    start = counted.rows
    out = explainer(hwc[None], max_evals=max_evals, silent=True)
    pix = np.asarray(out.values[0])[..., cls]  # [H, W, C]
    groups, _ = patch_groups((SIZE, SIZE), PATCH)
    per_patch = np.bincount(groups, pix.sum(axis=2).reshape(-1))
    return {"values": per_patch, "evals": counted.rows - start, "estimator": "shap partition"}


def relative(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(a - ref)) / max(float(np.linalg.norm(ref)), 1e-300)


def ig_case(model: Model, counted: Counted, x: np.ndarray, cls: int, steps: int, who: str) -> Any:
    """One integrated-gradients run: ours (explainers/gradients/integrated.py) or captum's."""
    if who == "ours":
        options = gradients.IntegratedGradientsOptions(baseline="zero", steps=steps)
        res = gradients.explain(model, x[None], options=options, target=cls)
        return np.asarray(res.explanations[0].values, dtype=np.float64)
    from captum.attr import IntegratedGradients

    xt = torch.tensor(x[None], dtype=torch.float32)
    out = IntegratedGradients(counted).attribute(
        xt, baselines=torch.zeros_like(xt), target=cls, n_steps=steps, method="gausslegendre"
    )
    return np.asarray(out.detach().double().numpy().reshape(-1))


CASES = ("default", "partition", "shap", "ig-ours", "ig-captum")


def run_case(args: argparse.Namespace, width: int) -> None:
    """Child process: one measured run (fresh memory), its result as JSON on stdout."""
    torch.set_num_threads(args.threads)
    model, counted = make_model(width)
    x = im.images(1, 3, SIZE, seed=0)[0]
    case, cls = args.case, args.cls
    runs: dict[str, Callable[[], Any]] = {
        "default": lambda: ours(model, x, "auto", None),
        "partition": lambda: ours(model, x, "partition", args.evals),
        "shap": lambda: theirs(counted, x, cls, args.evals),
        "ig-ours": lambda: ig_case(model, counted, x, cls, args.steps, "ours"),
        "ig-captum": lambda: ig_case(model, counted, x, cls, args.steps, "captum"),
    }
    # warm-up (first torch calls, shap's numba functions), not measured
    if case == "shap":
        theirs(counted, x, cls, 8)
    elif case.startswith("ig"):
        ig_case(model, counted, x, cls, 2, case[3:])
    else:
        ours(model, x, "partition", 8)
    out, took, mb = measure(runs[case])
    if isinstance(out, np.ndarray):
        out = {"values": out}
    out = {**out, "values": np.asarray(out["values"]).tolist(), "time": took, "mb": mb}
    print("RESULT " + json.dumps(out))


def child(args: argparse.Namespace, case: str, cls: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--case", case, "--cls", str(cls), "--evals",
           str(args.evals), "--steps", str(args.steps), "--threads", str(args.threads),
           "--width", str(args.width_resolved)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[len("RESULT ") :])
            res["values"] = np.asarray(res["values"])
            return dict(res)
    raise RuntimeError(f"case {case} failed:\n{done.stdout}\n{done.stderr}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="width 4, smaller references")
    parser.add_argument("--width", type=int, default=None, help="CNN width (default 16; 4)")
    parser.add_argument("--evals", type=int, default=500, help="shap's and partition's budget")
    parser.add_argument("--reference", type=int, default=None, help="partition references")
    parser.add_argument("--shapley-reference", type=int, default=None)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="/tmp/bench_images.md")
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)
    parser.add_argument("--cls", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    width = args.width or (4 if args.quick else 16)
    args.width_resolved = width
    if args.case:
        run_case(args, width)
        return
    reference = args.reference or args.evals * (3 if args.quick else 8)
    shapley_reference = args.shapley_reference or (4096 if args.quick else 16384)
    torch.set_num_threads(args.threads)

    model, counted = make_model(width)
    x = im.images(1, 3, SIZE, seed=0)[0]
    with torch.no_grad():
        counted(torch.tensor(x[None]))
        t0 = time.perf_counter()
        probs = counted(torch.tensor(np.repeat(x[None], 32, axis=0)))
        per_row = (time.perf_counter() - t0) / 32
    cls = int(probs[0].argmax())

    names = {"default": "ours shapley default", "partition": "ours partition (Owen)",
             "shap": "shap PartitionExplainer"}  # fmt: skip
    results = {case: child(args, case, cls) for case in (*names, "ig-ours", "ig-captum")}
    # references at a higher budget, same game definition (kernel: another seed)
    refs = {
        "default": ours(model, x, "kernel", shapley_reference, seed=1),
        "partition": ours(model, x, "partition", reference),
        "shap": theirs(counted, x, cls, reference),
    }
    default = results["default"]
    lines = [
        f"3x{SIZE}x{SIZE} rgb_cnn(width={width}, seed=0), {per_row * 1e3:.1f} ms per row "
        f"(batch of 32), {args.threads} torch threads, class {cls} explained; our patches "
        f"{default['patch']} px ({len(default['values'])} players), Gaussian blur sigma 5; "
        f"shap: {SIZE * SIZE * 3} pixel-channels, box blur {BOX} px, summed per patch",
        "",
        "| method | model evaluations | time (s) | peak memory (MB) | rel. error vs reference "
        "| reference | notes |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for case, name in names.items():
        res, ref = results[case], refs[case]
        if case == "default":
            name = f"{name} ({res['estimator']})"
        err = relative(res["values"], ref["values"])
        note = ", ".join(res.get("warnings", [])) or ("exact" if res.get("exact") else "")
        lines.append(
            f"| {name} | {res['evals']} | {res['time']:.2f} | {res['mb']:.0f} | {err:.4f} | "
            f"{ref['estimator']} at {ref['evals']} | {note} |"
        )
        res["err"] = err
    a, b = results["ig-ours"], results["ig-captum"]
    diff = float(np.max(np.abs(a["values"] - b["values"])))
    scale = float(np.max(np.abs(b["values"])))
    note = f"max abs difference {diff:.2e} (largest attribution {scale:.2e})"
    lines.append(f"| ours integrated gradients | | {a['time']:.2f} | {a['mb']:.0f} | | | {note} |")
    lines.append(f"| captum IntegratedGradients | | {b['time']:.2f} | {b['mb']:.0f} | | | |")
    p, s = results["partition"], results["shap"]
    lines += [
        "",
        f"At {args.evals} evaluations: shap / ours partition time {s['time'] / p['time']:.2f}x, "
        f"peak memory {s['mb'] / max(p['mb'], 1e-9):.2f}x; error {p['err']:.4f} (ours) vs "
        f"{s['err']:.4f} (shap). Default Shapley / partition time "
        f"{default['time'] / p['time']:.2f}x. IG: captum / ours time {b['time'] / a['time']:.2f}x.",
    ]
    command = "    .venv/bin/python bench/image_bench.py " + " ".join(sys.argv[1:])
    text = "\n".join([*lines, "", "Command:", "", command, ""])
    print(text)
    Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
