from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from models.registry import ModelRegistry


@pytest.fixture(scope="session")
def registry(model_dir: Path) -> ModelRegistry:
    reg = ModelRegistry(model_dir)
    reg.load_all()
    return reg


@pytest.fixture(scope="module")
def client(registry: ModelRegistry, make_client: Callable[..., TestClient]) -> TestClient:
    # load_models_on_start as before (Settings' default; make_client turns it off)
    return make_client(registry, max_body_bytes=200_000, load_models_on_start=True)
