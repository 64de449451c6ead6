"""Audit throughput: 2,000 breast-cancer-mlp rows with KernelSHAP on 1 and 2 Celery workers,
and a cached re-run. Real parts: a private redis-server, PostgreSQL (or SQLite with --sqlite).

The cached re-run submits the same audit again: every instance is a cache hit, looked up one
chunk at a time (one MGET) and stored with one write per chunk. The bench counts the Redis
commands each run issued (INFO commandstats of the private server: on the first run a chunk's
answers go in one MULTI/EXEC, so EXEC counts those round trips) and prints the speed-up.

Run: .venv/bin/python bench/audit_bench.py [--rows 2000] [--budget 20000] [--workers 1,2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fastapi.testclient import TestClient  # noqa: E402

from app.main import create_app  # noqa: E402
from app.settings import Settings  # noqa: E402
from models.registry import ModelRegistry  # noqa: E402
from tests.conftest import free_port  # noqa: E402


def database(use_sqlite: bool, tmp: Path) -> tuple[str, str | None]:
    if use_sqlite:
        return f"sqlite:///{tmp / 'jobs.db'}", None
    import psycopg

    name = f"attr_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}", name


def run_audit(client: TestClient, body: dict, poll: float = 0.2) -> tuple[float, dict]:
    start = time.perf_counter()
    job_id = client.post("/v2/jobs", json=body).json()["id"]
    while (status := client.get(f"/v2/jobs/{job_id}").json())["status"] not in (
        "succeeded",
        "failed",
        "cancelled",
    ):
        time.sleep(poll)
    return time.perf_counter() - start, status


def redis_calls(url: str) -> dict[str, int]:
    """Calls per command so far on the (private) Redis server."""
    import redis

    stats = redis.Redis.from_url(url).info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


def commands(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The cache's commands between two counts (EXEC: one MULTI/EXEC round trip of SETs)."""
    return {
        k: after[k] - before.get(k, 0)
        for k in ("get", "mget", "set", "exec")
        if after.get(k, 0) > before.get(k, 0)
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--budget", type=int, default=20000, help="model rows per instance")
    parser.add_argument("--sqlite", action="store_true")
    parser.add_argument("--workers", default="1,2", help="Celery worker counts to time")
    parser.add_argument("--chunk-size", type=int, default=50)
    args = parser.parse_args()
    tmp = Path(f"/tmp/audit-bench-{uuid.uuid4().hex[:6]}")
    tmp.mkdir()
    port = free_port()
    redis = subprocess.Popen(
        [
            shutil.which("redis-server") or "redis-server",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=subprocess.DEVNULL,
    )
    time.sleep(0.5)
    url = f"redis://127.0.0.1:{port}/0"
    db, pg_name = database(args.sqlite, tmp)
    settings = Settings(
        redis_url=url, database_url=db, job_queue="celery", job_chunk_size=args.chunk_size
    )
    registry = ModelRegistry(settings.model_dir)
    model = registry.get("breast-cancer-mlp")
    assert model.reference is not None
    rows = [
        model.reference[i % len(model.reference)] * (1 + 0.01 * (i // len(model.reference)))
        for i in range(args.rows)
    ]
    body = {
        "model": model.name,
        "inputs": [r.tolist() for r in rows],
        "budget": args.budget,
        "parameters": {"estimator": "kernel"},
    }
    env = {**os.environ, "REDIS_URL": url, "DATABASE_URL": db, "TORCH_THREADS": "1"}
    counts = [int(n) for n in args.workers.split(",")]
    print(
        f"{args.rows} rows, budget {args.budget} model rows each, chunks of {args.chunk_size}, "
        f"store {'sqlite' if args.sqlite else 'postgresql'}, {os.cpu_count()} cores"
    )
    timings = {}
    try:
        with TestClient(create_app(settings, registry)) as client:
            for n_workers in counts:
                workers = [
                    subprocess.Popen(
                        [sys.executable, "-m", "worker", "--log-level", "warning"],
                        cwd=ROOT,
                        env=env,
                    )
                    for _ in range(n_workers)
                ]
                time.sleep(4)  # workers load models and connect
                fresh = {**body, "seed": n_workers}  # a new seed: nothing cached
                start = redis_calls(url)
                took, status = run_audit(client, fresh)
                first = commands(start, redis_calls(url))
                timings[n_workers] = took
                print(
                    f"{n_workers} worker(s): {took:.1f} s, {args.rows / took:.1f} rows/s, "
                    f"{status['status']}; Redis cache commands {first}"
                )
                if n_workers == counts[-1]:
                    before = redis_calls(url)
                    again, status = run_audit(client, fresh, poll=0.02)
                    calls = commands(before, redis_calls(url))
                    chunks = -(-args.rows // args.chunk_size)
                    print(
                        f"cached re-run ({n_workers} workers): {again:.2f} s, "
                        f"{status['summary']['cache_hits']} cache hits, "
                        f"speed-up {took / again:.1f}x; Redis cache commands {calls} "
                        f"for {chunks} chunks"
                    )
                for w in workers:
                    w.terminate()
                    w.wait(timeout=30)
        if 1 in timings and 2 in timings:
            print(f"scaling 1 -> 2 workers: {timings[1] / timings[2]:.2f}x")
    finally:
        redis.terminate()
        if pg_name is not None:
            import psycopg

            with psycopg.connect(
                "postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True
            ) as c:
                c.execute(f'DROP DATABASE "{pg_name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
