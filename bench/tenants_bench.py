"""Two keys at once: does one key's flood of heavy explanations hold up another key's reads and
small requests? The real `python -m app` at its defaults with two API keys: key C keeps
--flood heavy explanations in flight (breast-cancer-mlp, 8 rows a request, no cache) for
--seconds; meanwhile key D sends, one after another, a model metadata read, an infer and a small
explanation (diabetes-mlp, one row, exact), and the bench records D's latencies (p50, p99, max)
and every status code each key got.

--root DIR runs the server from another checkout (e.g. a git worktree of an earlier commit), to
compare before and after in one run on the same machine.

Run:  .venv/bin/python bench/tenants_bench.py [--flood 64] [--seconds 30] [--root DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import bench.tree_audit_bench as tab  # noqa: E402

KEYS = {"C": "flood-key-secret-c", "D": "quiet-key-secret-d"}


def api_keys() -> str:
    return json.dumps(
        [
            {"name": name, "sha256": hashlib.sha256(secret.encode()).hexdigest(),
             "scopes": ["explain"]}
            for name, secret in KEYS.items()
        ]
    )  # fmt: skip


async def flood(
    http: Any, rows: list[list[float]], stop: float, codes: collections.Counter[int]
) -> None:
    body = {"inputs": rows, "seed": 0}
    headers = {"Authorization": f"Bearer {KEYS['C']}", "Cache-Control": "no-cache"}
    while time.monotonic() < stop:
        try:
            r = await http.post(
                "/v2/models/breast-cancer-mlp/explain/shapley", json=body, headers=headers
            )
            codes[r.status_code] += 1
            if r.status_code in (429, 503):
                await asyncio.sleep(float(r.headers.get("Retry-After", "1")))
        except Exception:  # a timeout or a dropped connection counts as 0
            codes[0] += 1


async def quiet(
    http: Any, row: list[float], stop: float, out: dict[str, list[float]], codes: Any
) -> None:
    headers = {"Authorization": f"Bearer {KEYS['D']}", "Cache-Control": "no-cache"}
    tensor = {"name": "x", "shape": [1, len(row)], "datatype": "FP32", "data": row}
    calls = {
        "metadata": ("GET", "/v2/models/diabetes-mlp", None),
        "infer": ("POST", "/v2/models/diabetes-mlp/infer", {"inputs": [tensor]}),
        "small explain": (
            "POST",
            "/v2/models/diabetes-mlp/explain/shapley",
            {"inputs": [row], "seed": 0},
        ),
    }
    while time.monotonic() < stop:
        for what, (method, url, body) in calls.items():
            t = time.perf_counter()
            try:
                r = await http.request(method, url, json=body, headers=headers)
                codes[(what, r.status_code)] += 1
                if what == "small explain" and r.status_code == 200:
                    out["small explain compute"].append(r.json()["meta"]["compute_ms"] / 1000)
            except Exception:
                codes[(what, 0)] += 1
            out[what].append(time.perf_counter() - t)
        await asyncio.sleep(0.2)


async def run(url: str, args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    limits = httpx.Limits(max_connections=args.flood + 8)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        headers = {"Authorization": f"Bearer {KEYS['D']}"}
        cancer = await http.get("/v2/models/breast-cancer-mlp/examples?n=8", headers=headers)
        diabetes = await http.get("/v2/models/diabetes-mlp/examples?n=1", headers=headers)
        rows = cancer.json()["instances"]
        row = diabetes.json()["instances"][0]
        stop = time.monotonic() + args.seconds
        c_codes: collections.Counter[int] = collections.Counter()
        d_codes: collections.Counter[tuple[str, int]] = collections.Counter()
        latencies: dict[str, list[float]] = collections.defaultdict(list)
        await asyncio.sleep(0)
        floods = [flood(http, rows, stop, c_codes) for _ in range(args.flood)]
        await asyncio.gather(*floods, quiet(http, row, stop, latencies, d_codes))
    return {
        "key_c_codes": {str(k): v for k, v in sorted(c_codes.items())},
        "key_d_codes": {f"{w} {c}": n for (w, c), n in sorted(d_codes.items())},
        "key_d_latency_s": {
            what: {
                "n": len(v),
                "p50": float(np.percentile(v, 50)),
                "p99": float(np.percentile(v, 99)),
                "max": float(max(v)),
            }
            for what, v in latencies.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--flood", type=int, default=64, help="key C's requests in flight")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout the server runs")
    parser.add_argument("--out", type=Path, default=Path("/tmp/tenants_bench.json"))
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tenants-bench-"))
    env_args = argparse.Namespace(database_url=None, model_dir=None, redis=None)
    env = tab.server_env(env_args, tmp)
    env["API_KEYS"] = api_keys()
    from app.settings import Settings

    env["MODEL_DIR"] = str(Settings().model_dir)  # the built-ins trained already
    tab.ROOT = args.root  # the server's checkout
    server = tab.start_server(env, tmp, 0)
    try:
        report = asyncio.run(run(server.url, args))
    finally:
        server.stop()
    report.update(root=str(args.root), flood=args.flood, seconds=args.seconds)
    print(json.dumps(report, indent=2))
    args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
