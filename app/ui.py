"""The web explorer at `/` (static files, no CDN) and the plot routes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import anyio
import numpy as np
from fastapi import APIRouter, FastAPI, Query, Request, Response
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from app import plot_images, plot_shap, plot_vega, plots
from app.auth import may_use
from app.dataplane import off_loop, service
from app.errors import ERROR_RESPONSES, ApiError
from app.routes import explain_route
from app.schemas import ExplainRequestBase, ExplainResponse, request_model
from app.service import ExplainService
from explainers.registry import EXPLAINERS, ExplainerSpec
from models.modality import Modality

STATIC = Path(__file__).parent / "static"
MEDIA = {"png": "image/png", "svg": "image/svg+xml"}
PLOT_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES,
    200: {
        "description": "PNG or SVG (matplotlib), a Vega-Lite v6 spec, or shap.Explanation "
        "keyword arguments (format=shap)",
        "content": {"image/png": {}, "image/svg+xml": {}, "application/json": {}},
    },
}

router = APIRouter()


@router.get("/", include_in_schema=False)
async def index() -> FileResponse:
    return FileResponse(STATIC / "index.html")


EXAMPLE_NUMBERS = 2**19  # numbers per examples answer (about 10 MB of JSON): 3 rows at 3x224x224


def _examples(svc: ExplainService, name: str, n: int) -> dict[str, Any]:
    model = svc.model(name)
    owner, _ = svc.registry.owner(name)
    if not may_use(owner, shared=False):  # a shared model's rows stay its owner's
        raise ApiError(
            f"the background rows of {name!r} are shown to the key that registered it only",
            code="forbidden",
        ).with_status(403)
    rows = model.background if model.background is not None else model.reference
    if rows is None:
        return {"instances": [], "min": None, "max": None, "source": None, "rows": 0}
    rows = np.asarray(rows)
    numeric = rows.dtype.kind in "fiu"
    per_row = max(1, int(np.prod(rows.shape[1:]))) if numeric else 1
    take = max(1, min(n, EXAMPLE_NUMBERS // per_row))
    tensor = numeric and rows.ndim > 2  # images: one minimum and maximum over all the data
    low = rows.min() if tensor else rows.min(axis=0) if numeric else None
    high = rows.max() if tensor else rows.max(axis=0) if numeric else None
    return {
        "instances": rows[:take].tolist(),
        "min": None if low is None else low.tolist(),
        "max": None if high is None else high.tolist(),
        "source": model.background_info.get("description"),
        "rows": len(rows),
    }


@router.get("/v2/models/{model}/examples", tags=["models"], responses={404: ERROR_RESPONSES[404]})
async def examples(request: Request, model: str, n: int = Query(5, ge=1, le=100)) -> dict[str, Any]:
    """A few instances from the model's stored background data (inputs for the explorer and
    for trying the API): the first n rows, fewer for large inputs (at most 2^19 numbers in
    all: 3 rows of a 3×224×224 image), with the minimum and maximum over that data (per
    feature for tables; one number each for images) and `rows`, how many it holds."""
    result: dict[str, Any] = await off_loop(request, _examples, service(request), model, n)
    return result


@dataclass(frozen=True)
class PlotQuery:
    format: str
    kind: str
    index: int
    max_features: int
    channels: str = "sum"


FORMAT = Query("png", description="png or svg (matplotlib), vega-lite, or shap")
KIND = Query(
    "auto",
    description="auto: heatmap for images, text for text players, waterfall for additive "
    "explanations, bar otherwise",
)
INDEX = Query(0, ge=0, description="which explanation of the response")
MAX_FEATURES = Query(20, ge=1, le=1000, description="bars shown; the rest are summed in one")
CHANNELS = Query(
    "sum",
    description="pixel attributions of an RGB image (gradient explainers, 3×H×W values): sum "
    "over the channels, one channel (r, g, b), or each channel in its own panel",
)


def image_facts(
    svc: ExplainService, answer: ExplainResponse, index: int
) -> tuple[plots.Classes, plots.Range]:
    """The top classes and the model's input_range (the scale of an RGB image's colours)."""
    value_range: plots.Range = None
    try:
        model = svc.model(answer.model_name)
        if model.version == answer.model_version and model.input_range is not None:
            value_range = (float(model.input_range[0]), float(model.input_range[1]))
    except Exception:  # no such model here: colours from the image's own values
        pass
    return top_classes(svc, answer, index), value_range


def top_classes(svc: ExplainService, answer: ExplainResponse, index: int) -> plots.Classes:
    """The three most probable classes of an image explanation's instance, when the model that
    answered is registered here in the same version (a heatmap shows them by the original)."""
    explanations = answer.data.explanations
    if not 0 <= index < len(explanations) or explanations[index].data is None:
        return None
    try:
        model = svc.model(answer.model_name)
        if (
            model.version != answer.model_version
            or model.modality != Modality.IMAGE
            or model.task != "classification"
        ):
            return None
        x = np.asarray(explanations[index].data, dtype=np.float64)
        probs = model.predict(x.reshape(1, *model.input_shape))[0]
    except Exception:  # no such model, data of another shape: the plot goes without them
        return None
    order = np.argsort(-probs)[:3]
    return [(model.output_names[i], float(probs[i])) for i in order]


async def render(body: ExplainResponse, q: PlotQuery, request: Request | None = None) -> Response:
    """Matplotlib runs in a worker thread: it is CPU work and must not block the loop."""
    if q.format == "shap":
        return JSONResponse(plot_shap.shap_arguments(body))
    classes, value_range = None, None
    if request is not None and q.kind in ("auto", "heatmap"):
        classes, value_range = await off_loop(
            request, image_facts, service(request), body, q.index
        )
    if q.format == "vega-lite":
        spec = await anyio.to_thread.run_sync(
            plot_vega.vega_lite,
            body, q.kind, q.index, q.max_features, classes, q.channels, value_range,
        )  # fmt: skip
        return JSONResponse(spec, media_type="application/json")
    image = await anyio.to_thread.run_sync(
        plot_images.image_bytes,
        body, q.format, q.kind, q.index, q.max_features, classes, q.channels, value_range,
    )  # fmt: skip
    return Response(image, media_type=MEDIA[q.format])


@router.post("/v2/plots", tags=["plots"], response_class=Response, responses=PLOT_RESPONSES)
async def plot_response(
    request: Request,
    body: ExplainResponse,
    format: plots.Format = FORMAT,
    kind: plots.Kind = KIND,
    index: int = INDEX,
    max_features: int = MAX_FEATURES,
    channels: plots.Channels = CHANNELS,
) -> Response:
    """Render an explain response (the JSON an explain route returned) as a plot: an image
    answer needs its instance (data; explain with return_inputs: true for large images)."""
    q = PlotQuery(format, kind, index, max_features, channels)
    return await render(body, q, request)


def plot_route(spec: ExplainerSpec) -> Callable[..., Awaitable[Response]]:
    """POST /v2/models/{model}/explain/<name>/plot: explain (cache, metrics as usual), render."""
    body_model = request_model(spec)
    explain = explain_route(spec)

    async def handler(
        request: Request,
        model: str,
        body: body_model,  # type: ignore[valid-type]
        format: plots.Format = FORMAT,
        kind: plots.Kind = KIND,
        index: int = INDEX,
        max_features: int = MAX_FEATURES,
        channels: plots.Channels = CHANNELS,
    ) -> Response:
        # the plot draws the instance: ask for it however large (ECHO_LIMIT)
        asked = cast(ExplainRequestBase, body).model_copy(update={"return_inputs": True})
        answer = await explain(request, model, asked)
        typed = ExplainResponse.model_validate_json(bytes(answer.body))
        q = PlotQuery(format, kind, index, max_features, channels)
        result = await render(typed, q, request)
        result.headers["X-Cache"] = answer.headers.get("X-Cache", "")
        return result

    handler.__annotations__["body"] = body_model
    handler.__name__ = f"plot_{spec.name.replace('-', '_')}"
    handler.__doc__ = f"{spec.description}, rendered as a plot (or shap.Explanation arguments)."
    return handler


def install(app: FastAPI) -> None:
    """The page, its static files and the plot routes."""
    app.include_router(router)
    for spec in EXPLAINERS:
        app.add_api_route(
            f"/v2/models/{{model}}/explain/{spec.name}/plot",
            plot_route(spec),
            methods=["POST"],
            tags=["plots"],
            response_class=Response,
            responses=PLOT_RESPONSES,
        )
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
