"""Shared by the training-job route tests (train-salvage, train-autognothi): a service with its
own artifact store and job database, a refused job's 4xx, and the admin scope training needs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from app.auth import digest
from app.main import create_app
from app.settings import Settings
from models.registry import ModelRegistry


# Not make_client: an unstarted client per call on `tmp`'s store and database, started and stopped
# inside a test (restarts); make_client's clients stay started until the module ends
def app_for(tmp: Path, registry: ModelRegistry, **kw: Any) -> TestClient:
    """A service whose artifact store and job database live under `tmp`; built-ins come from
    `registry`."""
    settings = Settings(
        model_dir=tmp / "models",
        redis_url=None,
        database_url=f"sqlite:///{tmp / 'jobs.db'}",
        load_models_on_start=False,
        **kw,
    )
    return TestClient(create_app(settings, registry))


def assert_refused(
    tmp: Path, registry: ModelRegistry, job: dict[str, Any], status: int, code: str
) -> None:
    """Submitting `job` answers `status` with the error code `code`."""
    with app_for(tmp, registry) as client:
        r = client.post("/v2/jobs", json=job)
        assert r.status_code == status, r.json()
        assert r.json()["code"] == code


def assert_needs_admin(tmp: Path, registry: ModelRegistry, job: dict[str, Any]) -> None:
    """A key with the 'jobs' scope only may not submit the training `job` (403)."""
    keys = [
        {"name": n, "sha256": digest(f"key-{n}").hex(), "scopes": s}
        for n, s in {"auditor": ["jobs"], "root": ["admin"]}.items()
    ]
    with app_for(tmp, registry, api_keys=json.dumps(keys)) as client:
        r = client.post("/v2/jobs", json=job, headers={"Authorization": "Bearer key-auditor"})
        assert r.status_code == 403
