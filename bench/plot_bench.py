"""Time of the plot route per format and kind, and the cost of the request-id/metrics middleware.

In-process (FastAPI TestClient, no network), built-in models, one explanation each:
diabetes-mlp (tabular, waterfall and bar), digits-cnn (8x8 image, heatmap), sentiment-minilm
(text), diabetes-mlp k-SII (interaction matrix). Each POST /v2/plots is timed `--repeat` times
after one warm-up; the median and p90 are printed in milliseconds. The middleware cost is the
median of GET /v2/health/live with and without the RequestContext middleware.

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
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return statistics.median(times), times[int(0.9 * (len(times) - 1))]


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
        print(f"| answer | kind | format | median ms | p90 ms |  (repeat {args.repeat})")
        print("|---|---|---|---|---|")
        for name, kind in cases:
            for fmt in ("png", "svg", "vega-lite", "shap"):
                if fmt == "shap" and kind != cases[0][1] and name != "text":
                    continue

                def call(fmt: str = fmt, kind: str = kind, name: str = name) -> None:
                    r = client.post(f"/v2/plots?format={fmt}&kind={kind}", json=answers[name])
                    r.raise_for_status()

                med, p90 = timed(call, args.repeat)
                print(f"| {name} | {kind} | {fmt} | {med:.1f} | {p90:.1f} |")

        with_mw = timed(lambda: client.get("/v2/health/live"), args.repeat * 10)[0]
    bare = create_app(Settings(redis_url=None), registry)
    bare.user_middleware = [m for m in bare.user_middleware if m.cls.__name__ != "RequestContext"]
    with TestClient(bare) as client:
        without = timed(lambda: client.get("/v2/health/live"), args.repeat * 10)[0]
    print(
        f"\nGET /v2/health/live median: {with_mw:.3f} ms with the request-id/metrics "
        f"middleware, {without:.3f} ms without"
    )


if __name__ == "__main__":
    main()
