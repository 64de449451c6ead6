"""Bounded time with real server processes and real clients: the default time limit, a
computation that stops when its client leaves, SIGTERM during a long explanation; and the
composition of the cancel checks (job cancel + client gone + shutdown) in-process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from explainers.games import Cancelled, DeadlineExceeded, GameRecorder, check_deadline, deadline
from explainers.games.deadlines import any_of, stop_when
from tests.conftest import ROOT, free_port

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@contextmanager
def server(
    model_dir: Path, tmp: Path, **env: str
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`python -m app` (one process, embedded mode) on a free port; its URL and process."""
    port = free_port()
    full = {
        **os.environ,
        "MODEL_DIR": str(model_dir),
        "JOB_QUEUE": "inprocess",
        "DATABASE_URL": f"sqlite:///{tmp / 'jobs.db'}",
        "USER_MODEL_DIR": str(tmp / "user-models"),
        "LOAD_BACKGROUND_MODELS": "false",  # the language models: not needed, seconds of CPU
        **env,
    }
    full.pop("REDIS_URL", None)
    full.pop("WEB_CONCURRENCY", None)
    cmd = [sys.executable, "-m", "app", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen([*cmd, "--log-level", "warning"], cwd=ROOT, env=full)
    url = f"http://127.0.0.1:{port}"
    try:
        limit = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None:
                pytest.fail("server exited")
            if time.monotonic() > limit:
                pytest.fail("server not ready in 120 s")
            time.sleep(0.2)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=20)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/<pid>/stat utime + stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # fields 14 and 15 of stat


def digit() -> list[Any]:
    from models.builtin.trained import dataset_split

    return dataset_split("digits-cnn").x_test[0].tolist()  # type: ignore[no-any-return]


def long_request() -> dict[str, Any]:
    """The issue's request: 64 pixel players, a budget of 2^24 coalitions, no timeout_ms."""
    params = {"patch_size": 1, "estimator": "kernel"}
    return {"inputs": [digit()], "budget": 2**24, "parameters": params}


SHAPLEY = "/v2/models/digits-cnn/explain/shapley"


@pytest.fixture(scope="module")
def default_server(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    with server(model_dir, tmp_path_factory.mktemp("bounded")) as pair:
        yield pair


def test_a_client_that_leaves_stops_its_computation(
    default_server: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, proc = default_server
    idle = cpu_seconds(proc.pid)
    time.sleep(1.0)
    assert cpu_seconds(proc.pid) - idle < 0.3, "the idle server computes"
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + SHAPLEY, json=long_request(), timeout=2.0)
    left = time.monotonic()
    time.sleep(1.0)
    before = cpu_seconds(proc.pid)
    time.sleep(3.0)
    used = cpu_seconds(proc.pid) - before
    assert used < 0.3, f"{used:.2f} s of CPU in the 3 s after the client left"
    assert time.monotonic() - left < 5
    metrics = httpx.get(url + "/metrics", timeout=10).text
    assert 'explain_cancelled_total{reason="disconnect"} 1.0' in metrics
    small = {"inputs": [digit()], "budget": 256, "parameters": {"patch_size": 4}}
    r = httpx.post(url + SHAPLEY, json=small, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["meta"]["cache"] == "miss"
    # Nothing of the cancelled request was cached: sent again it computes (and is cut again).
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + SHAPLEY, json=long_request(), timeout=1.0)


@pytest.fixture(scope="module")
def short_default(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    tmp = tmp_path_factory.mktemp("short")
    with server(model_dir, tmp, DEFAULT_TIMEOUT_MS="3000") as pair:
        yield pair


def test_the_default_limit_gives_the_anytime_estimate(
    short_default: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, _ = short_default
    start = time.monotonic()
    r = httpx.post(url + SHAPLEY, json=long_request(), timeout=30)
    took = time.monotonic() - start
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["meta"]["partial"] is True
    assert body["meta"]["cache"] == "bypass"  # a partial answer is never stored
    assert took < 5.0, took  # sampling stops early enough to fit what it has within 3 s
    assert 0 < body["meta"]["n_model_evals"] < 2**24
    e = body["data"]["explanations"][0]
    assert np.all(np.isfinite(e["values"]))
    # Efficiency holds for the anytime estimate too (KernelSHAP constrains the sum).
    total = sum(e["values"]) + e["base_value"]
    assert total == pytest.approx(e["instance_output_value"], abs=1e-4)


def slow_exact() -> dict[str, Any]:
    """Exact Shapley values over 16 patches with 20 background rows: 2^16 x 20 = 1.3M model
    rows (about 20 s of digits-cnn on one core); not a sampled estimator: no partial answer."""
    from models.builtin.trained import dataset_split

    background = dataset_split("digits-cnn").x_train[:20].tolist()
    params = {"patch_size": 2, "estimator": "exact"}
    return {"inputs": [digit()], "background": background, "budget": 2**24, "parameters": params}


def test_the_default_limit_answers_504_for_the_rest(
    short_default: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, proc = short_default
    start = time.monotonic()
    r = httpx.post(url + SHAPLEY, json=slow_exact(), timeout=60)
    took = time.monotonic() - start
    assert r.status_code == 504, r.text
    assert r.json()["code"] == "timeout"
    assert "DEFAULT_TIMEOUT_MS=3000" in r.json()["error"]
    assert 2.5 < took < 5.0, took
    # The abandoned computation was withdrawn too: the server goes quiet (a model call of
    # the game may still finish).
    time.sleep(1.0)
    before = cpu_seconds(proc.pid)
    time.sleep(2.0)
    assert cpu_seconds(proc.pid) - before < 0.3


def test_sigterm_cancels_running_explanations_after_the_grace(
    model_dir: Path, tmp_path: Path
) -> None:
    grace = 2.0
    with server(model_dir, tmp_path, SHUTDOWN_GRACE_S=str(grace)) as (url, proc):
        answers: list[httpx.Response] = []

        def call() -> None:
            answers.append(httpx.post(url + SHAPLEY, json=long_request(), timeout=60))

        client = threading.Thread(target=call)
        client.start()
        time.sleep(1.5)  # computing now
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=grace + 10)
        took = time.monotonic() - sent
        client.join(timeout=10)
    assert took < grace + 3, f"exited {took:.1f} s after SIGTERM"
    assert took > grace - 0.5  # the running request had its grace
    assert answers and answers[0].status_code == 503, answers
    assert answers[0].json()["code"] == "shutting_down"
    assert answers[0].headers["retry-after"] == "1"


def _game(masks: np.ndarray) -> np.ndarray:
    return masks.sum(axis=1).astype(np.float64)


def test_the_cancel_checks_compose() -> None:
    """A job's cancel flag, the client's and the server's shutdown: any one stops the work at
    the next model call; without any, the work runs."""
    job, client, shutdown = threading.Event(), threading.Event(), threading.Event()
    masks = np.ones((4, 3), dtype=bool)
    for flag in (job, client, shutdown):
        for f in (job, client, shutdown):
            f.clear()
        recorder = GameRecorder(_game, 3)
        with stop_when(job.is_set), stop_when(any_of(client.is_set, shutdown.is_set)):
            recorder(masks[:1])  # nothing set: it runs
            flag.set()
            with pytest.raises(Cancelled):
                recorder(masks[1:] & np.array([True, False, True]))
            with pytest.raises(Cancelled):
                check_deadline()
        check_deadline()  # outside the block no check is left behind
        assert recorder.n_coalitions == 1


def test_a_cancel_wins_over_a_passed_deadline() -> None:
    """Withdrawn work wants no answer: Cancelled, not the DeadlineExceeded that a sampling
    estimator would turn into a partial estimate."""
    with deadline(time.monotonic() - 1):
        with pytest.raises(DeadlineExceeded):
            check_deadline()
        with stop_when(lambda: True), pytest.raises(Cancelled):
            check_deadline()
    assert any_of(None, None) is None


def test_the_anytime_estimate_is_fitted_within_the_limit() -> None:
    """KernelSHAP's last fit over many coalitions takes seconds: sampling stops early enough
    that the partial estimate is ready by the deadline (a linear game: it is exact)."""
    from explainers.estimators.kernel import kernel

    weights = np.linspace(-1, 1, 64)

    def slow(masks: np.ndarray) -> np.ndarray:
        time.sleep(len(masks) * 5e-6)  # a fast model: the fit is a large share of the time
        return masks @ weights  # type: ignore[no-any-return]

    recorder = GameRecorder(slow, 64, budget=2**24)
    start = time.monotonic()
    with deadline(start + 4.0):
        est = kernel(recorder, np.random.default_rng(0))
    assert time.monotonic() - start < 4.0
    assert est.partial and est.n_coalitions > 8 * 64
    np.testing.assert_allclose(est.values, weights, atol=1e-8)
