"""Cache-hit path against the stack's ceiling, measured with wrk in one run.

Starts three servers on free loopback ports, one uvicorn process each:
* ours: `python -m app` (WEB_CONCURRENCY=1, REDIS_URL to the local Redis, a private db number,
  access logs on at info level, written to a file as in production), with its defaults: every
  hit is a Redis round trip;
* ours-local: the same with CACHE_LOCAL_ENTRIES=1024: recent Redis hits are answered from the
  process's memory;
* minimal: a FastAPI app with the same route whose handler takes the JSON body as a dict and
  returns the same ~1 KB answer (the cached README example's body) as a JSONResponse.

It warms our cache with the README's diabetes-mlp Shapley example, then runs wrk (POST, the
body from a Lua script) against each, alternating, at 1 and 32 connections, and prints
requests/s, p50/p99 and the ratios to minimal. Rounds alternate so all see the same load
from whatever else runs on the machine; the table reports each peer's median round.

    .venv/bin/python bench/hit_path_bench.py [--duration 10] [--rounds 3] [--redis-db 11]

Needs Debian's wrk (apt-get install wrk) and a Redis on 127.0.0.1:6379.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.responses import JSONResponse

ROOT = Path(__file__).resolve().parents[1]
PATH = "/v2/models/diabetes-mlp/explain/shapley"
README_BODY = {"inputs": [[50, 1, 25, 90, 180, 100, 50, 4, 4.5, 90]], "seed": 0}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_minimal(port: int, body_file: str) -> None:
    """The peer: the smallest idiomatic FastAPI endpoint answering the same body."""
    import uvicorn

    answer = json.loads(Path(body_file).read_text())
    app = FastAPI()

    @app.post("/v2/models/{model}/explain/shapley")
    async def explain(model: str, body: dict[str, Any]) -> JSONResponse:
        return JSONResponse(answer)

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def wait_ready(proc: subprocess.Popen[bytes], url: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"server {url} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    sys.exit(f"{url} not ready in {timeout_s} s")


def parse_ms(text: str) -> float:
    found = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text.strip())
    if found is None:
        raise ValueError(f"wrk latency {text!r}")
    return float(found.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[found.group(2)]


def wrk(base: str, lua: Path, connections: int, duration: float) -> dict[str, float]:
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{round(duration)}s", "--latency", "-s", str(lua),
         base + PATH],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = parse_ms(re.search(r"^\s+50%\s+(\S+)", out, re.M).group(1))  # type: ignore[union-attr]
    p99 = parse_ms(re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1))  # type: ignore[union-attr]
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    return {
        "rps": rps,
        "p50_ms": p50,
        "p99_ms": p99,
        "non_2xx": float(non2xx.group(1)) if non2xx else 0.0,
        "socket_errors": 1.0 if errors else 0.0,
    }


def start_ours(port: int, tmp: str, redis_db: int, local_entries: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "MODEL_DIR"}
    env.update(
        REDIS_URL=f"redis://127.0.0.1:6379/{redis_db}",
        DATABASE_URL=f"sqlite:///{tmp}/jobs-{port}.db",
        USER_MODEL_DIR=f"{tmp}/user-models-{port}",
        JOB_QUEUE="inprocess",
        LOAD_BACKGROUND_MODELS="false",
        WEB_CONCURRENCY="1",
        CACHE_LOCAL_ENTRIES=str(local_entries),
    )
    log = open(f"{tmp}/access-{port}.log", "wb")  # noqa: SIM115 (the child holds it)
    serve = [sys.executable, "-m", "app", "--host", "127.0.0.1", "--port", str(port)]
    return subprocess.Popen([*serve, "--log-level", "info"], cwd=ROOT, env=env, stderr=log)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per setting")
    parser.add_argument("--connections", default="1,32")
    parser.add_argument("--redis-db", type=int, default=11, help="not 0 or 15 (others' dbs)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    parser.add_argument("--serve-minimal", nargs=2, help=argparse.SUPPRESS)  # PORT BODY_FILE
    args = parser.parse_args()
    if args.serve_minimal:
        serve_minimal(int(args.serve_minimal[0]), args.serve_minimal[1])
        return
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed: apt-get install wrk")
    procs: list[subprocess.Popen[bytes]] = []
    peers = ("ours", "ours-local", "minimal")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            ports = {name: free_port() for name in peers}
            base = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
            for name, entries in (("ours", 0), ("ours-local", 1024)):
                procs.append(start_ours(ports[name], tmp, args.redis_db, entries))
                wait_ready(procs[-1], f"{base[name]}/v2/health/ready")
            first = httpx.post(base["ours"] + PATH, json=README_BODY, timeout=60)
            first.raise_for_status()
            for name in ("ours", "ours-local"):
                hit = httpx.post(base[name] + PATH, json=README_BODY, timeout=60)
                assert hit.headers["x-cache"] == "HIT", (name, hit.headers)
            answer = hit.json()
            body_file = Path(tmp) / "answer.json"
            body_file.write_text(json.dumps(answer))
            peer = [
                sys.executable,
                __file__,
                "--serve-minimal",
                str(ports["minimal"]),
                str(body_file),
            ]
            procs.append(subprocess.Popen(peer, cwd=ROOT))
            wait_ready(procs[-1], f"{base['minimal']}/openapi.json")
            size = {n: len(httpx.post(base[n] + PATH, json=README_BODY).content) for n in peers}
            lua = Path(tmp) / "post.lua"
            lua.write_text(
                'wrk.method = "POST"\n'
                f"wrk.body = {json.dumps(json.dumps(README_BODY))}\n"
                'wrk.headers["Content-Type"] = "application/json"\n'
            )
            print(f"response bytes: {size}; load {os.getloadavg()}")
            for name in peers:  # warm all (first-request imports, connections)
                wrk(base[name], lua, 4, 2)
            results: dict[str, Any] = {}
            for conns in [int(c) for c in args.connections.split(",")]:
                rounds: dict[str, list[dict[str, float]]] = {name: [] for name in peers}
                for r in range(args.rounds):
                    for name in peers:
                        m = wrk(base[name], lua, conns, args.duration)
                        rounds[name].append(m)
                        print(f"c={conns} round {r} {name}: {m}", flush=True)
                results[str(conns)] = {
                    name: {
                        k: statistics.median(m[k] for m in ms) for k in ("rps", "p50_ms", "p99_ms")
                    }
                    | {"non_2xx": sum(m["non_2xx"] for m in ms)}
                    for name, ms in rounds.items()
                }
                for name in ("ours", "ours-local"):  # median of the rounds' ratios
                    results[str(conns)][f"ratio_{name}"] = round(
                        statistics.median(
                            a["rps"] / b["rps"]
                            for a, b in zip(rounds[name], rounds["minimal"], strict=True)
                        ),
                        3,
                    )
            metrics = {n: httpx.get(base[n] + "/metrics").text for n in ("ours", "ours-local")}
            lines = {
                n: sum(1 for _ in open(f"{tmp}/access-{ports[n]}.log", "rb"))  # noqa: SIM115
                for n in ("ours", "ours-local")
            }
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(timeout=30)
    print()
    print("| connections | peer | requests/s | p50 ms | p99 ms | ratio to minimal |")
    print("|---|---|---|---|---|---|")
    for setting, res in results.items():
        for name in peers:
            m = res[name]
            ratio = res.get(f"ratio_{name}", 1.0)
            print(
                f"| {setting} | {name} | {m['rps']:.0f} | {m['p50_ms']:.2f} | {m['p99_ms']:.2f} "
                f"| {ratio:.2f} |"
            )
    for name in ("ours", "ours-local"):
        hits = re.search(r'explain_cache_requests_total\{result="hit"\} (\S+)', metrics[name])
        print(
            f"{name}: cache hits counted by /metrics {hits.group(1) if hits else '?'}, "
            f"access log lines {lines[name]}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "hit_path_bench.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
