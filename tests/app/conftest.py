from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from models.registry import ModelRegistry


@pytest.fixture(scope="session")
def registry(model_dir: Path) -> ModelRegistry:
    reg = ModelRegistry(model_dir)
    reg.load_all()
    return reg


@pytest.fixture(scope="module")
def client(registry: ModelRegistry, model_dir: Path) -> Iterator[TestClient]:
    settings = Settings(model_dir=model_dir, redis_url=None, max_body_bytes=200_000)
    with TestClient(create_app(settings, registry)) as c:
        yield c
