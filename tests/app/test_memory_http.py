"""Memory-bounded explanations over HTTP in a real server process (issue 26).

A ResNet-18-sized TorchScript CNN (tests/image_models.py, random weights) is registered for
3x224x224 images; a Shapley explanation and integrated gradients with their default options
must raise the server's peak resident memory (VmHWM, reset through /proc/<pid>/clear_refs,
minus VmRSS before the request) by less than 1 GB. Before MAX_BATCH_BYTES a model call took
`batch_size` = 65,536 rows: a default request on a 3x64x64 CNN raised the peak by 1.8 GB.

The Shapley request sends a smaller budget than the default (256 coalitions over 64 patches of
28 pixels, about 20 s on two slow cores), and the server runs with MAX_BATCH_BYTES = 64 MiB so
that those 256 masked rows go through many model calls (9 rows each). The memory of a call is
bounded by its rows, not by the number of calls: a larger budget makes more calls of the same
size, so the peak measured here is the peak of a default budget too (the masks themselves,
bool [coalitions, pixels], are built in chunks by the masked game, explainers/games/masked.py).
Without the bound (MAX_BATCH_BYTES = 64 GiB: all 256 rows in one call) the same request raised
the peak by 1.85 GB and integrated gradients (50 rows of backward pass) by 1.26 GB, so both
tests fail when the rows per call are not bounded.

Each peak is measured on a server that has served nothing else (freed memory that the
allocator keeps would hide part of the next request's), with glibc's mmap threshold fixed at
128 KiB so that tensors are mapped and unmapped and VmRSS before the request is what is live.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT, free_port
from tests.image_models import image_form, images, resnet18, rgb_cnn, torchscript_bytes

GB = 1e9
MIB = 1 << 20

# The registry gets the budget from the settings (app/main.py builds it).
# Not make_client: a uvicorn server in its own process (its memory is what is measured)
LAUNCH = """
import sys, uvicorn
from app.main import create_app
from app.settings import Settings
from models.registry import ModelRegistry
s = Settings()
registry = ModelRegistry(s.model_dir, device=s.device, max_batch_bytes=s.max_batch_bytes)
uvicorn.run(create_app(s, registry), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


class Server:
    def __init__(self, url: str, proc: subprocess.Popen[bytes]) -> None:
        self.url, self.proc = url, proc

    def status(self, key: str) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) * 1024
        raise KeyError(key)

    def peak_increase(self, send: Any) -> tuple[httpx.Response, int]:
        """(the answer, VmHWM during `send()` minus VmRSS before it)."""
        Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        before = self.status("VmRSS")
        answer = send()
        return answer, self.status("VmHWM") - before


@contextmanager
def start_server(tmp: Path, model_dir: Path) -> Iterator[Server]:
    port = free_port()
    env = {
        **os.environ,
        "MODEL_DIR": str(model_dir),
        "JOB_QUEUE": "inprocess",
        "DATABASE_URL": f"sqlite:///{tmp / 'jobs.db'}",
        "USER_MODEL_DIR": str(tmp / "user-models"),
        "LOAD_MODELS_ON_START": "false",
        "MAX_BATCH_BYTES": str(64 * MIB),
        "MALLOC_MMAP_THRESHOLD_": str(128 << 10),
    }
    env.pop("REDIS_URL", None)
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, str(port)], cwd=ROOT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        limit = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/v2/health/live", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, "server exited"
            assert time.monotonic() < limit, "server not up in 120 s"
            time.sleep(0.2)
        yield Server(url, proc)
    finally:
        proc.kill()
        proc.wait(timeout=20)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Server]:
    with start_server(tmp_path_factory.mktemp("memory-http"), model_dir) as running:
        yield running


def register(server: Server, name: str, module: Any, size: int) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v2/repository/models",
        data=image_form(name, 3, size),
        files={"file": (f"{name}.pt", torchscript_bytes(module))},
        timeout=300,
    )


def info_of(server: Server, name: str) -> dict[str, Any]:
    """The model's info as the registry serves it (its measured bytes and rows per call)."""
    r = httpx.get(f"{server.url}/v2/models/{name}", timeout=30)
    assert r.status_code == 200, r.text
    info: dict[str, Any] = r.json()["info"]
    return info


@pytest.fixture(scope="module")
def resnet(server: Server) -> dict[str, Any]:
    r = register(server, "resnet18-224", resnet18(), 224)
    assert r.status_code == 201, r.text
    return info_of(server, "resnet18-224")


def explain(server: Server, name: str, explainer: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}/v2/models/{name}/explain/{explainer}", json=body, timeout=600)


def test_metadata_shows_the_measured_rows_per_call(server: Server, resnet: dict[str, Any]) -> None:
    assert resnet["max_batch_bytes"] == 64 * MIB
    assert resnet["row_bytes"] > 3 * 224 * 224 * 4  # activations beyond the input
    assert resnet["rows_per_call"] == 64 * MIB // resnet["row_bytes"] >= 2
    assert resnet["grad_row_bytes"] > resnet["row_bytes"]


def test_shapley_on_a_224_resnet_raises_the_peak_by_less_than_1_gb(
    server: Server, resnet: dict[str, Any]
) -> None:
    x = images(1, 3, 224)[0].tolist()
    params = {"patch_size": 28}  # 64 players
    body = {"inputs": [x], "budget": 256, "seed": 0, "timeout_ms": 300_000, "parameters": params}
    r, increase = server.peak_increase(lambda: explain(server, "resnet18-224", "shapley", body))
    assert r.status_code == 200, r.text
    assert r.json()["meta"]["n_model_evals"] >= 3 * resnet["rows_per_call"]  # several calls
    assert increase < 1 * GB, increase


def test_integrated_gradients_on_a_224_resnet_raises_the_peak_by_less_than_1_gb(
    tmp_path: Path, model_dir: Path
) -> None:
    x = images(1, 3, 224, seed=1)[0].tolist()
    body = {"inputs": [x], "timeout_ms": 300_000}  # default steps (50), baseline zero
    with start_server(tmp_path, model_dir) as fresh:
        assert register(fresh, "resnet18-224", resnet18(), 224).status_code == 201
        rows = info_of(fresh, "resnet18-224")["grad_row_bytes"]
        assert 64 * MIB // rows < 50  # several backward passes
        send = lambda: explain(fresh, "resnet18-224", "integrated-gradients", body)  # noqa: E731
        r, increase = fresh.peak_increase(send)
    assert r.status_code == 200, r.text
    assert r.json()["meta"]["parameters"]["steps"] == 50
    assert increase < 1 * GB, increase


def test_a_row_that_cannot_fit_is_a_400(server: Server) -> None:
    """A 3x512x512 CNN: a forward pass of one row fits in 64 MiB (43 MiB), one with the
    backward pass does not (75 MiB): integrated gradients answer 400 before computing."""
    r = register(server, "cnn-512", rgb_cnn(3, 512), 512)
    assert r.status_code == 201, r.text
    info = info_of(server, "cnn-512")
    assert info["row_bytes"] < 64 * MIB < info["grad_row_bytes"], info
    assert info["rows_per_call"] == 1
    body = {"inputs": [images(1, 3, 512)[0].tolist()]}
    answer = explain(server, "cnn-512", "integrated-gradients", body)
    assert answer.status_code == 400, answer.text
    assert "MAX_BATCH_BYTES" in answer.json()["error"]
