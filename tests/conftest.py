"""Shared fixtures: the on-disk model cache, a real Redis server per test module."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import redis

from app.settings import Settings

if TYPE_CHECKING:
    from fastapi.testclient import TestClient


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session", autouse=True)
def private_job_database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Apps built from default settings keep jobs and registered models in temp folders."""
    private = {
        "DATABASE_URL": f"sqlite:///{tmp_path_factory.mktemp('db') / 'jobs.db'}",
        "USER_MODEL_DIR": str(tmp_path_factory.mktemp("user-models")),
        # Servers and apps under test don't preload the language models (1.6 GB, minutes of
        # CPU on a fresh machine); the LM tests load them once themselves.
        "LOAD_BACKGROUND_MODELS": "false",
    }
    old = {k: os.environ.get(k) for k in private}
    os.environ.update(private)
    yield
    for key, value in old.items():
        if value is None:
            os.environ.pop(key)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def model_dir() -> Path:
    """Built-in weights persist across runs (trained once with a fixed seed)."""
    return Path(os.environ.get("MODEL_DIR", Settings().model_dir))


@pytest.fixture(scope="module")
def make_client(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., TestClient]]:
    """make_client(registry=None, raise_server_exceptions=True, **settings): a started
    TestClient of create_app with embedded defaults (no Redis, its own job database and
    user-model folder, models loaded on first use); `settings` override them, `registry`
    shares a ModelRegistry. Every client made is closed when the module ends."""
    from fastapi.testclient import TestClient

    from app.main import create_app
    from models.registry import ModelRegistry

    stack = ExitStack()

    def make(
        registry: ModelRegistry | None = None,
        raise_server_exceptions: bool = True,
        **settings: Any,
    ) -> TestClient:
        tmp = tmp_path_factory.mktemp("client")
        values: dict[str, Any] = {
            "model_dir": model_dir,
            "user_model_dir": tmp / "user",
            "redis_url": None,
            "database_url": f"sqlite:///{tmp / 'jobs.db'}",
            "load_models_on_start": False,
            **settings,
        }
        app = create_app(Settings(**values), registry or ModelRegistry(model_dir))
        client = TestClient(app, raise_server_exceptions=raise_server_exceptions)
        return stack.enter_context(client)

    with stack:
        yield make


class RedisServer:
    """A private redis-server process on a free loopback port (real Redis, not a fake)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed; run scripts/setup.sh")
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        for _ in range(100):
            try:
                client.ping()
                return
            except redis.RedisError:
                time.sleep(0.05)
        pytest.fail("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None


ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def running_server(env: dict[str, str | None], timeout_s: float = 120) -> Iterator[str]:
    """`python -m app` on a free loopback port with `env` set (None values unset); its URL."""
    port = free_port()
    full = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=full,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None:
                pytest.fail("server exited")
            if time.monotonic() > deadline:
                pytest.fail(f"server not ready in {timeout_s} s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.fixture()
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def inprocess_server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real server process without Redis (jobs in-process), shared by the tests."""
    db = f"sqlite:///{tmp_path_factory.mktemp('server') / 'jobs.db'}"
    env = {
        "REDIS_URL": None,
        "MODEL_DIR": str(model_dir),
        "JOB_QUEUE": "inprocess",
        "DATABASE_URL": db,
    }
    with running_server(env) as url:
        yield url


@pytest.fixture(scope="session")
def one_torch_thread() -> Iterator[None]:
    """One torch thread, as the service runs (TORCH_THREADS): on two busy cores, small forward
    passes with two threads stall for whole scheduler slices (30x slower measured)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def text_model(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """sentiment-minilm, loaded once for every text test."""
    from models.builtin.text import load_sentiment_minilm

    return load_sentiment_minilm(tmp_path_factory.mktemp("text"))
