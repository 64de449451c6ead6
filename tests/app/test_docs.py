"""/docs and /redoc work offline: every asset they load is served by the service itself."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from app.auth import digest

URL = re.compile(r"""(?:src|href|url)\s*[=:(]\s*['"]?([^'")\s>]+)""")


@pytest.fixture(scope="module")
def client(make_client: Callable[..., TestClient]) -> TestClient:
    """With API keys configured: the docs stay readable without one."""
    keys = [{"name": "reader", "sha256": digest("key-reader").hex(), "scopes": ["explain"]}]
    return make_client(api_keys=json.dumps(keys))


def links(html: str) -> list[str]:
    return URL.findall(html)


@pytest.mark.parametrize(
    ("page", "assets"),
    [
        ("/docs", {"/docs/assets/swagger-ui-bundle.js", "/docs/assets/swagger-ui.css"}),
        ("/redoc", {"/docs/assets/redoc.standalone.js"}),
    ],
)
def test_docs_pages_load_only_local_assets(client: TestClient, page: str, assets: set[str]) -> None:
    r = client.get(page)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    assert "http://" not in html and "https://" not in html, "an external URL in the page"
    found = set(links(html))
    assert assets <= found, found
    assert "/openapi.json" in html
    for url in found:
        if url.startswith("/"):
            asset = client.get(url)
            assert asset.status_code == 200, url
            assert len(asset.content) > 1000, url


def test_assets_have_types_and_the_spec_is_public(client: TestClient) -> None:
    js = client.get("/docs/assets/swagger-ui-bundle.js")
    assert js.headers["content-type"].startswith("text/javascript")
    assert b"SwaggerUIBundle" in js.content
    css = client.get("/docs/assets/swagger-ui.css")
    assert css.headers["content-type"].startswith("text/css")
    redoc = client.get("/docs/assets/redoc.standalone.js")
    assert b"Redoc" in redoc.content
    assert client.get("/docs/assets/../settings.py").status_code == 404
    assert client.get("/docs/assets/nope.js").status_code == 404
    assert client.get("/docs/oauth2-redirect").status_code == 200
    spec = client.get("/openapi.json")
    assert spec.status_code == 200 and "/v2/jobs" in spec.json()["paths"]
    # Only the docs are open: the API still asks for a key.
    assert client.get("/v2/models").status_code == 401


def test_explorer_links_to_the_docs(client: TestClient) -> None:
    page = client.get("/").text
    assert 'href="/docs"' in page
