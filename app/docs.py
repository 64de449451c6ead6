"""/docs (Swagger UI) and /redoc served offline: their assets come from the fastapi-offline
package and are served by the service itself, so the pages work without reaching a CDN."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI, HTTPException
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import FileResponse, HTMLResponse

ASSETS = "/docs/assets"  # under /docs, which the API key check leaves open
FILES = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "redoc.standalone.js": "text/javascript",
    "favicon.png": "image/png",
}


def asset_dir() -> Path:
    """The static folder of the fastapi-offline package (Swagger UI, ReDoc, a favicon)."""
    return Path(str(files("fastapi_offline") / "static"))


def install(app: FastAPI) -> None:
    """Add /docs, /docs/oauth2-redirect, /redoc and their assets to an app built with
    docs_url=None and redoc_url=None."""
    folder = asset_dir()
    openapi_url = app.openapi_url or "/openapi.json"
    redirect = "/docs/oauth2-redirect"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=redirect,
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon.png",
            swagger_ui_parameters=app.swagger_ui_parameters,
        )

    @app.get(redirect, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS}/favicon.png",
            with_google_fonts=False,  # fonts from a CDN: the page falls back to system fonts
        )

    @app.get(f"{ASSETS}/{{name}}", include_in_schema=False)
    async def asset(name: str) -> FileResponse:
        if name not in FILES:  # a fixed list: no path from the request reaches the disk
            raise HTTPException(404, f"no docs asset {name!r}")
        return FileResponse(
            folder / name,
            media_type=FILES[name],
            headers={"Cache-Control": "public, max-age=86400"},
        )
