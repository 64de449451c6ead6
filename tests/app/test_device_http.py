"""The DEVICE setting through the service (issue 20): with DEVICE=cpu the service builds its
registry on the CPU and answers exactly as the default one, capabilities say where a model
computes, and DEVICE=cuda on a machine without CUDA stops `python -m app` with the reason."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
ROW = {"inputs": [[0.1] * 10], "parameters": {"estimator": "exact"}}


def test_cpu_device_answers_as_before(client: TestClient, model_dir: Path, tmp_path: Path) -> None:
    settings = Settings(
        model_dir=model_dir,
        redis_url=None,
        database_url=f"sqlite:///{tmp_path / 'jobs.db'}",
        user_model_dir=tmp_path / "user",
        load_models_on_start=False,
        device="cpu",
    )
    # Not make_client: the app builds its own registry from the settings (the device is what is
    # tested); make_client always passes a registry
    app = create_app(settings)  # its own registry, built from the settings
    assert app.state.service.registry.device == torch.device("cpu")
    with TestClient(app) as on_cpu:
        meta = on_cpu.get("/v2/models/diabetes-mlp").json()
        assert meta["capabilities"]["device"] == "cpu"
        assert meta["capabilities"]["differentiable"] is True
        url = "/v2/models/diabetes-mlp/explain/shapley"
        ours = on_cpu.post(url, json=ROW)
        assert ours.status_code == 200, ours.text
    default = client.post(url, json=ROW)  # the shared registry, built without a device
    assert default.status_code == 200
    assert ours.json()["data"] == default.json()["data"]
    assert client.get("/v2/models/diabetes-mlp").json()["capabilities"]["device"] == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_cuda_without_a_device_stops_the_start() -> None:
    env = {**os.environ, "DEVICE": "cuda", "REDIS_URL": "", "WEB_CONCURRENCY": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "app", "--port", "0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2, run.stderr
    assert "invalid settings" in run.stderr
    assert "DEVICE: DEVICE=cuda but torch sees no CUDA device" in run.stderr
    assert "set DEVICE=cpu or DEVICE=auto" in run.stderr
    assert "Traceback" not in run.stderr
