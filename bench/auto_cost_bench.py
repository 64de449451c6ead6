"""What `gp` costs on top of KernelSHAP in the service's default requests (issue 17: `auto`).

    .venv/bin/python bench/auto_cost_bench.py [--repeats 5]

The real app in-process (FastAPI TestClient, no Redis: every request a miss through distinct
seeds), the built-in models with the service's defaults (default budget: 2n + 2048 coalitions
times the background rows per coalition), `parameters.estimator` kernel and gp on the same
coalitions (gp fits KernelSHAP's plan). Prints the median `meta.compute_ms` of each and gp's
extra time against the request's time. One torch thread.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

torch.set_num_threads(1)

from app.main import create_app  # noqa: E402
from app.settings import Settings  # noqa: E402
from models.builtin.trained import dataset_split  # noqa: E402

SENTENCE = (
    "The service was slow and the soup arrived cold, but the staff apologised, the dessert was "
    "wonderful and we will probably come back next month"
)  # 24 words: sampled (2^24 coalitions do not fit the default budget)


def requests() -> dict[str, dict[str, Any]]:
    cancer = dataset_split("breast-cancer-mlp").x_test[0].tolist()
    digit = dataset_split("digits-cnn").x_test[0].tolist()
    return {
        "breast-cancer-mlp": {"inputs": [cancer]},
        "digits-cnn": {"inputs": [digit], "parameters": {"patch_size": 1}},
        "sentiment-minilm": {"inputs": [SENTENCE]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="auto-cost-") as tmp:
        settings = Settings(
            redis_url=None,
            database_url=f"sqlite:///{Path(tmp) / 'jobs.db'}",
            user_model_dir=Path(tmp) / "user",
            load_models_on_start=False,
            load_background_models=False,
            torch_threads=1,
            explain_workers=1,
        )
        with TestClient(create_app(settings)) as client:
            print("| model | players | coalitions | model rows | kernel ms | gp ms | gp extra |")
            print("|---|---|---|---|---|---|---|")
            for model, body in requests().items():
                times: dict[str, list[float]] = {"kernel": [], "gp": []}
                meta: dict[str, Any] = {}
                for rep in range(args.repeats + 1):  # the first is a warm-up
                    for est in times:
                        params = {**body.get("parameters", {}), "estimator": est}
                        r = client.post(
                            f"/v2/models/{model}/explain/shapley",
                            json={**body, "parameters": params, "seed": 1000 + rep},
                        )
                        assert r.status_code == 200, r.text
                        answer = r.json()
                        meta = answer["meta"]
                        if rep:
                            times[est].append(float(meta["compute_ms"]))
                k, g = (statistics.median(times[e]) for e in ("kernel", "gp"))
                n = len(answer["data"]["explanations"][0]["values"])
                rows = int(meta["n_model_evals"])
                coalitions = int(meta.get("n_coalitions", 0)) or "-"
                print(
                    f"| {model} | {n} | {coalitions} | {rows} | {k:.0f} | {g:.0f} | "
                    f"{(g - k) / k:+.0%} |"
                )


if __name__ == "__main__":
    main()
