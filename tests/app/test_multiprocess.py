"""Two real API processes on one PostgreSQL and one Redis, each with its own empty folder for
registered models: a model registered on one is listed and explained on the other, a new
version reaches the other, and a removal on either is seen by both."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.app.test_jobs_celery import postgres_url  # noqa: F401 (a fixture)
from tests.app.test_repository import form, scripted
from tests.conftest import RedisServer, running_server

pytestmark = pytest.mark.slow

W1 = [1.0, -2.0, 0.5, 3.0]
W2 = [2.0, 0.0, -1.0, 0.5]
BACKGROUND = np.array([[0.0, 1.0, 2.0, 3.0], [2.0, 3.0, 0.0, 1.0], [1.0, -1.0, 4.0, 5.0]])
X = [1.0, 2.0, 3.0, 4.0]


def csv(rows: np.ndarray) -> bytes:
    return ("a,b,c,d\n" + "\n".join(",".join(str(v) for v in r) for r in rows) + "\n").encode()


@pytest.fixture()
def servers(
    redis_server: RedisServer,
    postgres_url: str,  # noqa: F811 (the fixture imported above)
    model_dir: Path,
    tmp_path: Path,
) -> Iterator[tuple[httpx.Client, httpx.Client, Path, Path]]:
    def env(user_dir: Path) -> dict[str, str | None]:
        return {
            "DATABASE_URL": postgres_url,
            "REDIS_URL": redis_server.url,
            "JOB_QUEUE": "inprocess",
            "MODEL_DIR": str(model_dir),  # built-in weights: shared, trained once
            "USER_MODEL_DIR": str(user_dir),  # this process's own, empty at start
            "LOAD_BACKGROUND_MODELS": "false",
        }

    one, two = tmp_path / "user-1", tmp_path / "user-2"
    with (
        running_server(env(one)) as url1,
        running_server(env(two)) as url2,
        httpx.Client(base_url=url1, timeout=60) as c1,
        httpx.Client(base_url=url2, timeout=60) as c2,
    ):
        yield c1, c2, one, two


def eventually(check: Callable[[], Any], timeout_s: float = 10.0) -> Any:
    """`check()` once it is truthy; the other process's view of the store is ~1 s stale."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def register(client: httpx.Client, weights: list[float]) -> str:
    r = client.post(
        "/v2/repository/models",
        data=form(),
        files={"file": ("m.pt", scripted(weights)), "background": ("bg.csv", csv(BACKGROUND))},
    )
    assert r.status_code == 201, r.text
    return str(r.json()["versions"][0])


def explain(client: httpx.Client) -> dict[str, Any]:
    r = client.post("/v2/models/linear-user/explain/shapley", json={"inputs": [X]})
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_register_on_one_explain_on_the_other(
    servers: tuple[httpx.Client, httpx.Client, Path, Path],
) -> None:
    c1, c2, _, dir2 = servers
    v1 = register(c1, W1)
    listed = eventually(lambda: {m["name"] for m in c2.get("/v2/models").json()} >= {"linear-user"})
    assert listed
    ready = c2.get("/v2/health/ready")  # a stored model not built yet never holds readiness
    assert ready.status_code == 200 and ready.json()["models"]["linear-user"]["background"]
    assert c2.get("/v2/models/linear-user").json()["versions"] == [v1]

    # Exact Shapley values of a linear model against the stored background: w·(x − mean).
    mean = BACKGROUND.mean(axis=0)
    body = explain(c2)
    assert body["model_version"] == v1 and body["meta"]["exact"] is True
    values = body["data"]["explanations"][0]["values"]
    np.testing.assert_allclose(values, np.multiply(W1, np.subtract(X, mean)), rtol=1e-5, atol=1e-5)
    assert (dir2 / "linear-user" / v1 / "model").is_file()  # read from the database once

    # A new version on the first process: the second answers with it.
    v2 = register(c1, W2)
    assert v2 != v1
    assert eventually(lambda: c2.get("/v2/models/linear-user").json()["versions"] == [v2])
    body = explain(c2)
    assert body["model_version"] == v2 and body["meta"]["cache"] == "miss"
    values = body["data"]["explanations"][0]["values"]
    np.testing.assert_allclose(values, np.multiply(W2, np.subtract(X, mean)), rtol=1e-5, atol=1e-5)
    assert not (dir2 / "linear-user" / v1).exists()  # the earlier version's cached files

    # Removed on the second process: the first one answers 404.
    assert c2.delete("/v2/repository/models/linear-user").status_code == 204
    assert c2.get("/v2/models/linear-user").status_code == 404
    assert eventually(lambda: c1.get("/v2/models/linear-user").status_code == 404)
    r = c1.post("/v2/models/linear-user/explain/shapley", json={"inputs": [X]})
    assert r.status_code == 404 and r.json()["code"] == "unknown_model"
    assert "linear-user" not in {m["name"] for m in c1.get("/v2/models").json()}
    assert c1.delete("/v2/repository/models/linear-user").status_code == 404
