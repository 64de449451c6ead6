"""Time of the plot route per format and kind, and the cost of the request-id/metrics middleware.

In-process (FastAPI TestClient, no network), built-in models, one explanation each:
diabetes-mlp (tabular, waterfall and bar), digits-cnn (8x8 image, heatmap), sentiment-minilm
(text), diabetes-mlp k-SII (interaction matrix). Each POST /v2/plots is timed `--repeat` times
after one warm-up; the medians of wall time and of this process's CPU time are printed in
milliseconds. The middleware cost is the median CPU time of GET /v2/health/live with and
without the RequestContext middleware.

    .venv/bin/python bench/plot_bench.py [--repeat 20]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from models.registry import ModelRegistry

ROW = [50, 1, 25.0, 90.0, 200, 100, 50, 4, 5.0, 90]
DIGIT = (
    [[0, 0, 5, 13, 9, 1, 0, 0]] + [[0, 3, 15, 2, 0, 11, 8, 0]] * 6 + [[0, 0, 6, 13, 10, 0, 0, 0]]
)


def timed(fn: Any, repeat: int) -> tuple[float, float]:
    """Median wall ms and median CPU ms of this process (CPU time is steadier on a busy host)."""
    fn()
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - start) * 1000)
        cpu.append((time.process_time() - start_cpu) * 1000)
    return statistics.median(wall), statistics.median(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    registry = ModelRegistry(Settings().model_dir)
    registry.load_all()
    with TestClient(create_app(Settings(redis_url=None), registry)) as client:

        def answer(model: str, body: dict[str, Any]) -> dict[str, Any]:
            r = client.post(f"/v2/models/{model}/explain/shapley", json=body)
            r.raise_for_status()
            return dict(r.json())

        answers = {
            "tabular": answer("diabetes-mlp", {"inputs": [ROW]}),
            "image": answer("digits-cnn", {"inputs": [DIGIT]}),
            "text": answer("sentiment-minilm", {"inputs": ["a wonderful cast, but a dull plot"]}),
            "interactions": answer(
                "diabetes-mlp", {"inputs": [ROW], "parameters": {"index": "k-SII"}}
            ),
        }
        cases = [
            ("tabular", "waterfall"),
            ("tabular", "bar"),
            ("image", "heatmap"),
            ("text", "text"),
            ("interactions", "interactions"),
        ]
        print(f"{args.repeat} runs each")
        print("| answer | kind | format | wall ms (median) | CPU ms (median) |")
        print("|---|---|---|---|---|")
        for name, kind in cases:
            for fmt in ("png", "svg", "vega-lite", "shap"):
                if fmt == "shap" and kind != cases[0][1] and name != "text":
                    continue

                def call(fmt: str = fmt, kind: str = kind, name: str = name) -> None:
                    r = client.post(f"/v2/plots?format={fmt}&kind={kind}", json=answers[name])
                    r.raise_for_status()

                wall, cpu = timed(call, args.repeat)
                print(f"| {name} | {kind} | {fmt} | {wall:.1f} | {cpu:.1f} |")

        with_mw = timed(lambda: client.get("/v2/health/live"), args.repeat * 20)[1]
    bare = create_app(Settings(redis_url=None), registry)
    bare.user_middleware = [m for m in bare.user_middleware if m.cls.__name__ != "RequestContext"]
    with TestClient(bare) as client:
        without = timed(lambda: client.get("/v2/health/live"), args.repeat * 20)[1]
    print(
        f"\nGET /v2/health/live, median CPU ms: {with_mw:.3f} with the request-id/metrics "
        f"middleware, {without:.3f} without"
    )


if __name__ == "__main__":
    main()
