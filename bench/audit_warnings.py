"""What docs/jobs.md says of an audit's warnings, measured: breast-cancer-mlp audits of the first
rows of scikit-learn's breast-cancer data at the default budget and at `"budget": 8000` (80
coalitions for 30 features x 100 background rows), through the service's job queue (embedded
defaults: in-process jobs, SQLite in a temporary folder). Prints, per budget, the estimator
`auto` chose, how many rows carry each warning code, and the share of rows whose top feature is
the audit's global one.

    .venv/bin/python bench/audit_warnings.py [--rows 20] [--budgets default,8000]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fastapi.testclient import TestClient  # noqa: E402
from sklearn.datasets import load_breast_cancer  # noqa: E402

from app.main import create_app  # noqa: E402
from app.settings import Settings  # noqa: E402


def audit(client: TestClient, rows: list[list[float]], budget: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "breast-cancer-mlp", "inputs": rows}
    if budget is not None:
        body["budget"] = budget
    r = client.post("/v2/jobs", json=body)
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    while (status := client.get(f"/v2/jobs/{job}").json())["status"] in ("queued", "running"):
        time.sleep(0.5)
    assert status["status"] == "succeeded", status
    lines = client.get(f"/v2/jobs/{job}/results", params={"offset": 0, "limit": 1000}).text
    return {"status": status, "results": [line for line in lines.splitlines() if line]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=20)
    parser.add_argument("--budgets", default="default,8000")
    args = parser.parse_args()
    x = load_breast_cancer().data[: args.rows].tolist()
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            user_model_dir=Path(tmp) / "user",
            database_url=f"sqlite:///{tmp}/jobs.db",
            redis_url=None,
        )
        with TestClient(create_app(settings)) as client:
            for b in args.budgets.split(","):
                budget = None if b == "default" else int(b)
                out = audit(client, x, budget)
                answers = [json.loads(line)["explanation"] for line in out["results"]]
                chosen: Counter[str] = Counter(
                    str((a.get("details") or {}).get("auto", {}).get("chosen", "-"))
                    for a in answers
                )
                summary = out["status"].get("summary") or {}
                print(
                    f"budget {b}: {len(answers)} rows; warnings {summary.get('warnings')}; "
                    f"auto chose {dict(chosen)}; top1_agreement {summary.get('top1_agreement')}"
                )


if __name__ == "__main__":
    main()
