"""Load test of the real server over loopback: cached and uncached explain requests, mixed.

Starts a private redis-server and `python -m app` (REDIS_URL to it, MODEL_DIR unset, jobs in a
throwaway SQLite file) on free loopback ports, then drives the server from this process with
httpx.AsyncClient at a fixed concurrency for a fixed time. Not a CI test.

    .venv/bin/python bench/load_bench.py [--concurrency 32] [--duration 60] [--out bench/out]

Request classes (picked at random per request, seeded):
* cached: one of a small fixed set of diabetes-mlp shapley bodies, primed before the run, so
  every answer should be a cache hit;
* uncached-kernel: breast-cancer-mlp, `estimator: kernel`, budget 8000, `Cache-Control: no-cache`;
* uncached-exact: diabetes-mlp with a new seed per request (exact: 2^10 coalitions x 100
  background rows), a cache miss.

`--wrk`: instead, wrk (Debian's wrk, a C load generator that does not saturate first) drives
`python -m app` at WEB_CONCURRENCY 1 and 2 (`--processes`) with three mixes at `--concurrency`
connections: cached (the primed set), mixed (`--cached-share` cached, the rest new-seed
diabetes exact Shapley, cache misses) and uncached (misses only); it prints requests/s and
p50/p99 per mix and process count, and writes `<out>/load_bench_wrk.json`.

    .venv/bin/python bench/load_bench.py --wrk [--processes 1,2] [--duration 10]

Reports total requests, errors (non-200 or transport errors, with the request that caused
them), p50/p99 latency per class and throughput; writes everything to
`<out>/load_bench.json` (`--name`).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]

DIABETES_ROWS = [
    [50, 1, 25, 90, 180, 100, 50, 4, 4.5, 90],
    [60, 2, 30, 100, 200, 120, 40, 5, 5.0, 100],
    [40, 1, 22, 80, 160, 90, 60, 3, 4.2, 85],
    [70, 2, 28, 110, 220, 140, 45, 5, 5.2, 110],
]
CANCER_ROWS = [
    [
        17.99,
        10.38,
        122.8,
        1001.0,
        0.1184,
        0.2776,
        0.3001,
        0.1471,
        0.2419,
        0.07871,
        1.095,
        0.9053,
        8.589,
        153.4,
        0.006399,
        0.04904,
        0.05373,
        0.01587,
        0.03003,
        0.006193,
        25.38,
        17.33,
        184.6,
        2019.0,
        0.1622,
        0.6656,
        0.7119,
        0.2654,
        0.4601,
        0.1189,
    ],
    [
        13.54,
        14.36,
        87.46,
        566.3,
        0.09779,
        0.08129,
        0.06664,
        0.04781,
        0.1885,
        0.05766,
        0.2699,
        0.7886,
        2.058,
        23.56,
        0.008462,
        0.0146,
        0.02387,
        0.01315,
        0.0198,
        0.0023,
        15.11,
        19.26,
        99.7,
        711.2,
        0.144,
        0.1773,
        0.239,
        0.1288,
        0.2977,
        0.07259,
    ],
]
EXPLAIN = "/v2/models/{}/explain/shapley"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cached_bodies() -> list[dict[str, Any]]:
    """The fixed set of cached requests: 4 rows x 2 seeds, one instance each."""
    return [{"inputs": [row], "seed": seed} for row in DIABETES_ROWS for seed in (0, 1)]


def start_redis() -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is not installed; run scripts/setup.sh")
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return proc, f"redis://127.0.0.1:{port}/0"


def start_server(
    redis_url: str, db_dir: str, processes: int | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "MODEL_DIR"}
    # The mix uses tabular models only: don't let the language models load during the run.
    env.update(
        REDIS_URL=redis_url,
        DATABASE_URL=f"sqlite:///{db_dir}/jobs.db",
        LOAD_BACKGROUND_MODELS="false",
    )
    if processes is not None:
        env["WEB_CONCURRENCY"] = str(processes)
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "warning"],
        cwd=ROOT,
        env=env,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"server exited with {proc.returncode}")
        try:
            ready = httpx.get(f"{base}/v2/health/ready", timeout=2)
            if ready.status_code == 200 and ready.json()["status"] == "ready":
                return proc, base
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    proc.terminate()
    sys.exit("server not ready in 300 s")


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    arr = np.asarray(values) * 1000.0
    return {
        "n": len(values),
        "p50_ms": round(float(np.percentile(arr, 50)), 2),
        "p90_ms": round(float(np.percentile(arr, 90)), 2),
        "p99_ms": round(float(np.percentile(arr, 99)), 2),
        "max_ms": round(float(arr.max()), 2),
        "mean_ms": round(float(arr.mean()), 2),
    }


async def drive(base: str, concurrency: int, duration: float, mix: dict[str, float]) -> dict:
    cached = cached_bodies()
    seeds = itertools.count(1000)
    latencies: dict[str, list[float]] = {k: [] for k in mix}
    cache_status: dict[str, dict[str, int]] = {k: {} for k in mix}
    errors: list[dict[str, Any]] = []
    rng = random.Random(0)
    classes, weights = list(mix), list(mix.values())

    def make(kind: str) -> tuple[str, dict[str, Any], dict[str, str]]:
        if kind == "cached":
            return EXPLAIN.format("diabetes-mlp"), rng.choice(cached), {}
        if kind == "uncached-kernel":
            body = {
                "inputs": [rng.choice(CANCER_ROWS)],
                "seed": 0,
                "budget": 8000,
                "parameters": {"estimator": "kernel"},
            }
            return EXPLAIN.format("breast-cancer-mlp"), body, {"Cache-Control": "no-cache"}
        body = {"inputs": [rng.choice(DIABETES_ROWS)], "seed": next(seeds)}
        return EXPLAIN.format("diabetes-mlp"), body, {}

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:
        # prime the cached set (and check it answers)
        for body in cached:
            r = await client.post(EXPLAIN.format("diabetes-mlp"), json=body)
            r.raise_for_status()
        stop_at = time.perf_counter() + duration

        async def worker() -> None:
            while time.perf_counter() < stop_at:
                kind = rng.choices(classes, weights)[0]
                path, body, headers = make(kind)
                t0 = time.perf_counter()
                try:
                    r = await client.post(path, json=body, headers=headers)
                except httpx.HTTPError as exc:
                    errors.append({"class": kind, "path": path, "body": body,
                                   "headers": headers, "error": repr(exc)})  # fmt: skip
                    continue
                elapsed = time.perf_counter() - t0
                if r.status_code != 200:
                    errors.append({"class": kind, "path": path, "body": body,
                                   "headers": headers, "status": r.status_code,
                                   "response": r.text[:2000]})  # fmt: skip
                    continue
                latencies[kind].append(elapsed)
                status = r.json()["meta"]["cache"]
                cache_status[kind][status] = cache_status[kind].get(status, 0) + 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0

    ok = sum(len(v) for v in latencies.values())
    return {
        "concurrency": concurrency,
        "duration_s": duration,
        "wall_s": round(wall, 2),
        "total_requests": ok + len(errors),
        "ok": ok,
        "errors": len(errors),
        "error_samples": errors[:20],
        "throughput_rps": round((ok + len(errors)) / wall, 1),
        "latency": {k: percentiles(v) for k, v in latencies.items()},
        "throughput_rps_per_class": {k: round(len(v) / wall, 1) for k, v in latencies.items()},
        "meta_cache": cache_status,
        "all_latency": percentiles([x for v in latencies.values() for x in v]),
    }


WRK_LUA = """
local cached = {%s}
local share = %f
local headers = {["Content-Type"] = "application/json"}
math.randomseed(os.time())
request = function()
  if math.random() < share then
    return wrk.format("POST", "%s", headers, cached[math.random(#cached)])
  end
  local row = "[50, 1, 25, 90, 180, 100, 50, 4, 4.5, 90]"
  local body = '{"inputs": [' .. row .. '], "seed": ' .. math.random(1, 2000000000) .. '}'
  return wrk.format("POST", "%s", headers, body)
end
"""


def wrk_run(base: str, lua: str, connections: int, duration: float) -> dict[str, float]:
    import re

    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(lua)
    out = subprocess.run(
        ["wrk", "-t2", f"-c{connections}", f"-d{round(duration)}s", "--latency", "-s", f.name,
         "--timeout", "30s", base],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    os.unlink(f.name)

    def ms(pattern: str) -> float:
        found = re.search(r"^\s+" + pattern + r"\s+([\d.]+)(us|ms|s|m)\b", out, re.M)
        if found is None:
            return float("nan")
        return float(found.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[found.group(2)]

    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    return {
        "rps": float(rps.group(1)) if rps else float("nan"),
        "p50_ms": ms("50%"),
        "p99_ms": ms("99%"),
        "non_2xx": float(non2xx.group(1)) if non2xx else 0.0,
    }


def main_wrk(args: argparse.Namespace) -> None:
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed: apt-get install wrk")
    bodies = ", ".join(json.dumps(json.dumps(b)) for b in cached_bodies())
    path = EXPLAIN.format("diabetes-mlp")
    mixes = {"cached": 1.0, "mixed": args.cached_share, "uncached": 0.0}
    results: dict[str, Any] = {}
    redis_proc, redis_url = start_redis()
    try:
        for n in [int(p) for p in args.processes.split(",")]:
            with tempfile.TemporaryDirectory() as db_dir:
                server, base = start_server(redis_url, db_dir, n)
                try:
                    for body in cached_bodies():  # prime the cached set
                        httpx.post(base + path, json=body, timeout=60).raise_for_status()
                    for name, share in mixes.items():
                        lua = WRK_LUA % (bodies, share, path, path)
                        m = wrk_run(base, lua, args.concurrency, args.duration)
                        results[f"{n}:{name}"] = m
                        print(f"processes {n}, {name}: {m} load {os.getloadavg()}", flush=True)
                finally:
                    server.terminate()
                    server.wait(timeout=30)
    finally:
        redis_proc.terminate()
        redis_proc.wait(timeout=10)
    print("\n| mix | processes | requests/s | p50 ms | p99 ms | non-2xx |")
    print("|---|---|---|---|---|---|")
    for key, m in results.items():
        count, name = key.split(":")
        print(
            f"| {name} | {count} | {m['rps']:.0f} | {m['p50_ms']:.1f} | {m['p99_ms']:.1f} "
            f"| {m['non_2xx']:.0f} |"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "load_bench_wrk.json").write_text(json.dumps(results, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--cached-share", type=float, default=0.8)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    parser.add_argument("--name", default="load_bench", help="result file: <out>/<name>.json")
    parser.add_argument("--wrk", action="store_true", help="drive with wrk (see above)")
    parser.add_argument("--processes", default="1,2", help="WEB_CONCURRENCY values for --wrk")
    args = parser.parse_args()
    if args.wrk:
        main_wrk(args)
        return
    rest = round((1.0 - args.cached_share) / 2, 4)
    mix = {"cached": args.cached_share, "uncached-kernel": rest, "uncached-exact": rest}

    redis_proc, redis_url = start_redis()
    server = None
    try:
        with tempfile.TemporaryDirectory() as db_dir:
            server, base = start_server(redis_url, db_dir)
            result = asyncio.run(drive(base, args.concurrency, args.duration, mix))
            result.update(mix=mix, machine={"cpus": os.cpu_count()}, command=" ".join(sys.argv))
            server.terminate()
            server.wait(timeout=30)
            server = None
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        redis_proc.terminate()
        redis_proc.wait(timeout=10)

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "error_samples"}, indent=2))
    for err in result["error_samples"]:
        print("ERROR", json.dumps(err))
    cached_p50 = result["latency"]["cached"].get("p50_ms", float("inf"))
    print(f"errors: {result['errors']} (target 0): {'met' if not result['errors'] else 'MISSED'}")
    print(f"cached p50: {cached_p50} ms (target < 5 ms): {'met' if cached_p50 < 5 else 'MISSED'}")


if __name__ == "__main__":
    main()
