"""Fault tests: Redis killed and restarted under load; corrupt built-in model caches on disk."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from models.builtin.trained import TrainConfig, _spec
from models.catalog import BUILTINS
from models.registry import ModelRegistry
from tests.conftest import RedisServer, running_server

ROOT = Path(__file__).resolve().parents[1]
EXPLAIN = "/v2/models/diabetes-mlp/explain/shapley"
ROW = [50, 1, 25, 90, 180, 100, 50, 4, 4.5, 90]


@pytest.fixture()
def server(redis_server: RedisServer, model_dir: Path) -> Iterator[str]:
    """The real server process (python -m app) with REDIS_URL to the private Redis."""
    with running_server({"REDIS_URL": redis_server.url, "MODEL_DIR": str(model_dir)}) as url:
        yield url


@pytest.mark.slow
def test_redis_killed_and_restarted_under_load(server: str, redis_server: RedisServer) -> None:
    """4 workers for 6-8 s: Redis stops after ~2 s and comes back ~2 s later on the same port.

    Each phase lasts at least 2 s and at most until what it must show was seen (10 s bound).
    """
    phase = "before"  # before -> down -> after; read by the workers, written by this thread
    results: list[dict[str, Any]] = []  # one per request: phase, status, cache (or error)
    ready: list[tuple[str, int, str]] = []  # (phase, http status, body status)
    stop = threading.Event()
    lock = threading.Lock()

    def worker(i: int) -> None:
        n = 0
        with httpx.Client(base_url=server, timeout=30) as http:
            while not stop.is_set():
                # a small rotating set of bodies: repeats become hits while Redis is up
                body = {"inputs": [ROW], "seed": 100 * i + n % 5}
                n += 1
                started = phase
                try:
                    r = http.post(EXPLAIN, json=body)
                    record = {"phase": started, "status": r.status_code, "body": body}
                    if r.status_code == 200:
                        record["cache"] = r.json()["meta"]["cache"]
                    else:
                        record["text"] = r.text[:500]
                except httpx.HTTPError as exc:
                    record = {"phase": started, "status": -1, "error": repr(exc), "body": body}
                with lock:
                    results.append(record)

    def poll_ready() -> None:
        with httpx.Client(base_url=server, timeout=30) as http:
            while not stop.is_set():
                started = phase
                r = http.get("/v2/health/ready")
                with lock:
                    ready.append((started, r.status_code, r.json().get("status", "")))
                time.sleep(0.1)

    def seen(predicate: Any, timeout: float = 10.0) -> bool:
        """Wait (bounded) until predicate() holds on what the threads recorded so far."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with lock:
                if predicate():
                    return True
            time.sleep(0.05)
        return False

    def cache_seen(when: str, status: str) -> bool:
        return any(r["phase"] == when and r.get("cache") == status for r in results)

    def ready_seen(when: str, status: str) -> bool:
        return any(p == when and s == status for p, _, s in ready)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    threads.append(threading.Thread(target=poll_ready))
    for t in threads:
        t.start()
    try:
        time.sleep(2.0)
        assert seen(lambda: cache_seen("before", "hit")), "no cache hit before the outage"
        redis_server.stop()
        phase = "down"
        time.sleep(2.0)
        assert seen(lambda: cache_seen("down", "bypass")), "no bypass during the outage"
        assert seen(lambda: ready_seen("down", "degraded")), "ready never said degraded"
        phase = "restarting"
        redis_server.start()  # same port
        phase = "after"
        time.sleep(2.0)
        assert seen(lambda: cache_seen("after", "hit")), "no cache hit after the restart"
        assert seen(lambda: ready_seen("after", "ready")), "ready never recovered"
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)

    # requests queued during a phase change may be answered in the next phase, so the
    # statuses are checked per phase only for presence, plus: no request failed at all
    failed = [r for r in results if r["status"] != 200]
    assert not failed, failed[:5]
    assert all(code == 200 for _, code, _ in ready), ready

    with httpx.Client(base_url=server, timeout=30) as http:
        assert http.get("/v2/health/ready").json()["status"] == "ready"
        body = {"inputs": [ROW], "seed": 987654}
        first = http.post(EXPLAIN, json=body).json()["meta"]["cache"]
        second = http.post(EXPLAIN, json=body).json()["meta"]["cache"]
        assert (first, second) == ("miss", "hit")


DIABETES = [b for b in BUILTINS if b.name == "diabetes-mlp"]


def _cache_files(cache_dir: Path) -> tuple[Path, Path]:
    cfg: TrainConfig = _spec("diabetes-mlp").config
    stem = f"{cfg.name}-{cfg.digest()}"
    return cache_dir / f"{stem}.pt", cache_dir / f"{stem}.json"


@pytest.fixture(scope="module")
def trained_cache(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A private MODEL_DIR with diabetes-mlp trained once, and that model's version."""
    cache_dir = tmp_path_factory.mktemp("models")
    version = ModelRegistry(cache_dir, DIABETES).get("diabetes-mlp").version
    return cache_dir, version


def _garbage(path: Path) -> None:
    path.write_bytes(os.urandom(4096))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _wrong_state(path: Path) -> None:
    torch.save({"0.scale": torch.ones(3), "bogus.weight": torch.zeros(2, 2)}, path)


def _nan_state(path: Path) -> None:
    state = torch.load(path, weights_only=True)
    for value in state.values():
        value.fill_(float("nan"))
    torch.save(state, path)


@pytest.mark.parametrize(
    ("which", "corrupt"),
    [
        ("weights", _garbage),
        ("weights", _truncate),
        ("weights", _wrong_state),
        ("weights", _nan_state),
        ("meta", _truncate),
        ("meta", _garbage),
    ],
)
def test_corrupt_model_cache_is_rebuilt(
    trained_cache: tuple[Path, str],
    which: str,
    corrupt: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache_dir, version = trained_cache
    weights, meta = _cache_files(cache_dir)
    assert weights.exists() and meta.exists()
    target = weights if which == "weights" else meta
    corrupt(target)

    with caplog.at_level(logging.WARNING, logger="models.builtin"):
        model = ModelRegistry(cache_dir, DIABETES).get("diabetes-mlp")

    assert model.version == version  # deterministic retraining
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("corrupt model cache" in w and str(target) in w for w in warnings), warnings
    # the cache was rewritten and is good again: the next load reads it without a warning
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="models.builtin"):
        again = ModelRegistry(cache_dir, DIABETES).get("diabetes-mlp")
    assert again.version == version
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert model.info["training"]["train_rows"] == again.info["training"]["train_rows"]
