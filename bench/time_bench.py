"""Bounded time, measured on a real server: CPU after a client disconnect, time to answer
without timeout_ms, exit time after SIGTERM during a long explanation.

    .venv/bin/python bench/time_bench.py [--root DIR] [--skip-default]

--root: the code to serve (default: this checkout); the same venv runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

TICKS = os.sysconf("SC_CLK_TCK")
SHAPLEY = "/v2/models/digits-cnn/explain/shapley"


def cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(root: Path, **env: str) -> tuple[str, subprocess.Popen[bytes]]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-time-"))
    p = port()
    full = {**os.environ, "JOB_QUEUE": "inprocess", "DATABASE_URL": f"sqlite:///{tmp}/j.db",
            "USER_MODEL_DIR": str(tmp / "u"), "LOAD_BACKGROUND_MODELS": "false", **env}  # fmt: skip
    full.pop("REDIS_URL", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "--port", str(p), "--log-level", "warning"],
        cwd=root, env=full, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{p}"
    while True:
        try:
            if httpx.get(url + "/v2/health/ready", timeout=2).status_code == 200:
                return url, proc
        except httpx.TransportError:
            pass
        time.sleep(0.2)


def digit(root: Path) -> list[object]:
    sys.path.insert(0, str(root))
    from models.builtin.trained import dataset_split

    return dataset_split("digits-cnn").x_test[0].tolist()


def long_request(image: list[object]) -> dict[str, object]:
    return {"inputs": [image], "budget": 2**24,
            "parameters": {"patch_size": 1, "estimator": "kernel"}}  # fmt: skip


def disconnect(root: Path, image: list[object]) -> dict[str, float]:
    url, proc = start(root)
    try:
        idle0 = cpu(proc.pid)
        time.sleep(1)
        idle = cpu(proc.pid) - idle0
        with contextlib.suppress(httpx.ReadTimeout):
            httpx.post(url + SHAPLEY, json=long_request(image), timeout=2.0)
        time.sleep(1.0)
        a = cpu(proc.pid)
        time.sleep(3.0)
        after = cpu(proc.pid) - a
        t = time.monotonic()
        ok = httpx.post(url + SHAPLEY, json={"inputs": [image], "budget": 256,
                        "parameters": {"patch_size": 4}}, timeout=120)  # fmt: skip
        return {"idle_cpu_s_per_s": idle, "cpu_s_in_3s_from_1s_after": after,
                "next_request_status": ok.status_code,
                "next_request_s": time.monotonic() - t}  # fmt: skip
    finally:
        proc.kill()
        proc.wait()


def default_limit(root: Path, image: list[object], ms: str | None) -> dict[str, object]:
    url, proc = start(root, **({"DEFAULT_TIMEOUT_MS": ms} if ms else {}))
    try:
        t = time.monotonic()
        r = httpx.post(url + SHAPLEY, json=long_request(image), timeout=200)
        body = r.json()
        return {"status": r.status_code, "seconds": round(time.monotonic() - t, 2),
                "partial": body.get("meta", {}).get("partial"),
                "n_model_evals": body.get("meta", {}).get("n_model_evals")}  # fmt: skip
    finally:
        proc.kill()
        proc.wait()


def sigterm(root: Path, image: list[object], wait_s: float = 40) -> dict[str, object]:
    url, proc = start(root)
    answers: list[object] = []

    def call() -> None:
        try:
            r = httpx.post(url + SHAPLEY, json=long_request(image), timeout=120)
            answers.append([r.status_code, r.json().get("code")])
        except httpx.HTTPError as exc:
            answers.append(type(exc).__name__)

    threading.Thread(target=call, daemon=True).start()
    time.sleep(2)
    t = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=wait_s)
        took: float | str = round(time.monotonic() - t, 2)
    except subprocess.TimeoutExpired:
        took = f"still running after {wait_s} s (killed)"
        proc.kill()
        proc.wait()
    time.sleep(0.5)
    return {"exit_s_after_sigterm": took, "client_saw": answers}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, default=Path.cwd())
    parser.add_argument("--skip-default", action="store_true")
    args = parser.parse_args()
    image = digit(args.root)
    out: dict[str, object] = {"disconnect": disconnect(args.root, image)}
    if not args.skip_default:
        out["default_limit_3000ms"] = default_limit(args.root, image, "3000")
        out["default_limit_default"] = default_limit(args.root, image, None)
    out["sigterm"] = sigterm(args.root, image)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
