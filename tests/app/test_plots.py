"""Plot routes: PNG and SVG decode, Vega-Lite validates against the official schema, the data in
each plot is the explanation's own (heatmap patches, waterfall ends at the output), and a
format=shap answer rebuilds a shap.Explanation that shap's plots accept."""

from __future__ import annotations

import io
import itertools
import json
import xml.etree.ElementTree as ET
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

matplotlib.use("Agg")

ROW = [50, 1, 25.0, 90.0, 200, 100, 50, 4, 5.0, 90]
DIGIT_16 = [  # sklearn digits are on 0-16; the model reads 0-1
    [0, 0, 5, 13, 9, 1, 0, 0],
    [0, 0, 13, 15, 10, 15, 5, 0],
    [0, 3, 15, 2, 0, 11, 8, 0],
    [0, 4, 12, 0, 0, 8, 8, 0],
    [0, 5, 8, 0, 0, 9, 8, 0],
    [0, 4, 11, 0, 1, 12, 7, 0],
    [0, 2, 14, 5, 10, 12, 0, 0],
    [0, 0, 6, 13, 10, 0, 0, 0],
]
DIGIT = [[v / 16 for v in row] for row in DIGIT_16]


@cache
def vega_lite_validator() -> Any:
    """The Vega-Lite JSON schema that altair ships (the official one, version 6)."""
    import altair
    import jsonschema

    path = Path(altair.__file__).parent / "vegalite" / "v6" / "schema" / "vega-lite-schema.json"
    schema = json.loads(path.read_text())
    return jsonschema.validators.validator_for(schema)(schema)


def explain(client: TestClient, model: str, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post(f"/v2/models/{model}/explain/shapley", json=body)
    assert r.status_code == 200, r.text
    return dict(r.json())


@pytest.fixture(scope="module")
def tabular(client: TestClient) -> dict[str, Any]:
    return explain(
        client, "diabetes-mlp", {"inputs": [ROW, [40, 2, 30, 80, 150, 90, 40, 3, 4, 80]]}
    )


@pytest.fixture(scope="module")
def digit(client: TestClient) -> dict[str, Any]:
    return explain(client, "digits-cnn", {"inputs": [DIGIT], "parameters": {"patch_size": 2}})


@pytest.fixture(scope="module")
def text(client: TestClient) -> dict[str, Any]:
    return explain(client, "sentiment-minilm", {"inputs": ["a great movie", "dull, slow plot"]})


@pytest.mark.parametrize("kind", ["auto", "bar", "waterfall"])
def test_png_and_svg_of_a_tabular_explanation(
    client: TestClient, tabular: dict[str, Any], kind: str
) -> None:
    r = client.post(f"/v2/plots?format=png&kind={kind}", json=tabular)
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    image = Image.open(io.BytesIO(r.content))
    image.load()
    assert image.format == "PNG" and image.width > 200 and image.height > 100
    r = client.post(f"/v2/plots?format=svg&kind={kind}", json=tabular)
    assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg+xml")
    root = ET.fromstring(r.content)
    assert root.tag.endswith("svg") and len(root.attrib["viewBox"].split()) == 4


def test_vega_lite_waterfall_runs_from_base_to_output(
    client: TestClient, tabular: dict[str, Any]
) -> None:
    for index, e in enumerate(tabular["data"]["explanations"]):
        r = client.post(f"/v2/plots?format=vega-lite&kind=waterfall&index={index}", json=tabular)
        assert r.status_code == 200
        spec = r.json()
        vega_lite_validator().validate(spec)
        rows = spec["data"]["values"]
        assert rows[0]["start"] == pytest.approx(e["base_value"])
        # additive (exact SV): the last bar ends at the model's output
        assert rows[-1]["end"] == pytest.approx(e["instance_output_value"], abs=1e-6)
        for a, b in itertools.pairwise(rows):
            assert b["start"] == pytest.approx(a["end"])


def test_vega_lite_bar_keeps_the_largest_and_sums_the_rest(
    client: TestClient, tabular: dict[str, Any]
) -> None:
    r = client.post("/v2/plots?format=vega-lite&kind=bar&max_features=3", json=tabular)
    spec = r.json()
    vega_lite_validator().validate(spec)
    values = np.array(tabular["data"]["explanations"][0]["values"])
    names = tabular["data"]["feature_names"]
    order = np.argsort(-np.abs(values))
    rows = spec["data"]["values"]
    assert [row["player"] for row in rows[:3]] == [names[i] for i in order[:3]]
    assert rows[3]["player"] == "7 other players"
    assert rows[3]["value"] == pytest.approx(values[order[3:]].sum())


def test_image_heatmap_puts_each_patch_value_on_its_pixels(
    client: TestClient, digit: dict[str, Any]
) -> None:
    e = digit["data"]["explanations"][0]
    names = digit["data"]["feature_names"]
    r = client.post("/v2/plots?format=vega-lite", json=digit)  # auto: heatmap
    spec = r.json()
    vega_lite_validator().validate(spec)
    cells = {(row["row"], row["col"]): row for row in spec["data"]["values"]}
    assert len(cells) == 64
    for name, value in zip(names, e["values"], strict=True):
        pr, pc = (int(x) for x in name.split("_")[1:])
        for dr in range(2):
            for dc in range(2):
                cell = cells[(2 * pr + dr, 2 * pc + dc)]
                assert cell["value"] == pytest.approx(value)
                assert cell["pixel"] == DIGIT[2 * pr + dr][2 * pc + dc]
    png = client.post("/v2/plots?format=png", json=digit)
    assert png.status_code == 200 and Image.open(io.BytesIO(png.content)).format == "PNG"


def test_text_highlight_plots(client: TestClient, text: dict[str, Any]) -> None:
    r = client.post("/v2/plots?format=vega-lite&index=1", json=text)
    spec = r.json()
    vega_lite_validator().validate(spec)
    e = text["data"]["explanations"][1]
    assert [row["word"] for row in spec["data"]["values"]] == [p["text"] for p in e["players"]]
    assert [row["value"] for row in spec["data"]["values"]] == pytest.approx(e["values"])
    for fmt in ("png", "svg"):
        assert client.post(f"/v2/plots?format={fmt}&index=1", json=text).status_code == 200


def test_interaction_matrix(client: TestClient) -> None:
    body = {"inputs": [ROW], "parameters": {"index": "k-SII", "max_order": 2}}
    r = client.post(
        "/v2/models/diabetes-mlp/explain/shapley/plot?format=vega-lite&kind=interactions",
        json=body,
    )
    assert r.status_code == 200, r.text
    spec = r.json()
    vega_lite_validator().validate(spec)
    answer = explain(client, "diabetes-mlp", body)  # cached: the same numbers
    terms = answer["data"]["explanations"][0]["interactions"]["values"]
    names = answer["data"]["feature_names"]
    cells = {(row["row"], row["col"]): row["value"] for row in spec["data"]["values"]}
    for key, value in terms.items():
        idx = [int(i) for i in key.split(",")]
        if len(idx) == 2:
            a, b = names[idx[0]], names[idx[1]]
            assert cells[(a, b)] == pytest.approx(value) and cells[(b, a)] == pytest.approx(value)
        elif len(idx) == 1:
            assert cells[(names[idx[0]], names[idx[0]])] == pytest.approx(value)
    png = client.post(
        "/v2/models/diabetes-mlp/explain/shapley/plot?format=png&kind=interactions", json=body
    )
    assert png.status_code == 200 and png.headers["x-cache"] == "HIT"


def test_explain_and_plot_in_one_call(client: TestClient) -> None:
    r = client.post(
        "/v2/models/digits-cnn/explain/shapley/plot?format=svg",
        json={"inputs": [DIGIT], "parameters": {"patch_size": 4}},
    )
    assert r.status_code == 200 and ET.fromstring(r.content).tag.endswith("svg")


def test_shap_format_rebuilds_a_shap_explanation(
    client: TestClient, tabular: dict[str, Any], text: dict[str, Any]
) -> None:
    import matplotlib.pyplot as plt
    import shap

    from xai.client import shap_explanation

    r = client.post("/v2/plots?format=shap", json=tabular)
    assert r.status_code == 200
    ex = shap_explanation(r.json())
    assert isinstance(ex, shap.Explanation)
    want = np.array([e["values"] for e in tabular["data"]["explanations"]])
    np.testing.assert_allclose(ex.values, want)
    np.testing.assert_allclose(ex.data, [e["data"] for e in tabular["data"]["explanations"]])
    assert list(ex.feature_names) == tabular["data"]["feature_names"]
    shap.plots.waterfall(ex[0], show=False)
    # shap's waterfall checks additivity itself: base + sum(values) must reach the output
    assert ex[0].base_values + ex[0].values.sum() == pytest.approx(
        tabular["data"]["explanations"][0]["instance_output_value"], abs=1e-6
    )
    plt.close("all")
    shap.plots.bar(ex, show=False)
    plt.close("all")

    r = client.post(
        "/v2/models/sentiment-minilm/explain/shapley/plot?format=shap",
        json={"inputs": ["a great movie", "dull, slow plot"]},
    )
    words = shap_explanation(r.json())
    second = text["data"]["explanations"][1]
    # the tokens keep their spacing and punctuation: joined, they are the text as sent
    assert "".join(words[1].data) == "dull, slow plot"
    assert list(words[1].feature_names) == [p["text"] for p in second["players"]]
    np.testing.assert_allclose(words[1].values, second["values"])
    html = shap.plots.text(words[1], display=False)
    assert all(p["text"] in html for p in second["players"])


@pytest.mark.parametrize(
    ("query", "status", "code"),
    [
        ("format=png&kind=heatmap", 400, "invalid_input"),  # a table row is no image
        ("format=png&kind=interactions", 400, "invalid_input"),  # no interactions asked
        ("format=png&index=5", 400, "invalid_input"),
        ("format=gif", 422, None),
        ("format=png&kind=pie", 422, None),
    ],
)
def test_bad_plot_requests_are_4xx(
    client: TestClient, tabular: dict[str, Any], query: str, status: int, code: str | None
) -> None:
    r = client.post(f"/v2/plots?{query}", json=tabular)
    assert r.status_code == status, r.text
    if code:
        assert r.json()["code"] == code


def test_malformed_response_body_is_422(client: TestClient) -> None:
    r = client.post("/v2/plots?format=png", json={"data": {"explanations": []}})
    assert r.status_code == 422 and "error" in r.json()


def test_inconsistent_answers_are_400_not_500(client: TestClient, tabular: dict[str, Any]) -> None:
    """/v2/plots takes any client-made body: broken pieces are refused with a clear error."""
    import copy

    bad_keys = copy.deepcopy(tabular)
    e = bad_keys["data"]["explanations"][0]
    e["interactions"] = {"index": "k-SII", "values": {"a,b": 1.0}}
    out_of_range = copy.deepcopy(bad_keys)
    out_of_range["data"]["explanations"][0]["interactions"]["values"] = {"0,99": 1.0}
    empty_image = copy.deepcopy(tabular)
    empty_image["data"]["explanations"][0]["data"] = [[]]
    ragged_image = copy.deepcopy(tabular)
    ragged_image["data"]["explanations"][0]["data"] = [[1, 2], [3]]
    cases = [
        (bad_keys, "interactions"),
        (out_of_range, "interactions"),
        (empty_image, "heatmap"),
        (ragged_image, "heatmap"),
    ]
    for body, kind in cases:
        for fmt in ("png", "vega-lite"):
            r = client.post(f"/v2/plots?format={fmt}&kind={kind}", json=body)
            assert r.status_code == 400, (kind, fmt, r.text)
            assert r.json()["code"] == "invalid_input"
    for body, _ in cases:  # auto falls back to a chart that fits
        assert client.post("/v2/plots?format=png", json=body).status_code == 200
        assert client.post("/v2/plots?format=shap", json=body).status_code == 200


def test_values_whose_sum_overflows_are_400(client: TestClient) -> None:
    """Found by schemathesis: each value finite, their running sum is not."""
    body = {
        "model_name": "m",
        "model_version": "v",
        "id": "x",
        "meta": {"explainer": "e", "explainer_version": "1", "seed": 0, "budget": 1,
                 "n_model_evals": 1, "n_instances": 1, "exact": False, "additive": False,
                 "compute_ms": 0.0, "cache": "bypass", "parameters": {}},
        "data": {"feature_names": [], "output_names": [], "explanations": [
            {"output_index": 0, "output_name": "", "data": None,
             "values": [1.98e301, 1.7976929362853103e308], "base_value": 0.0,
             "instance_output_value": 0.0, "approximation_error": 0.0, "exact": False,
             "estimator": "", "n_model_evals": 0}]},
    }  # fmt: skip
    for fmt in ("vega-lite", "png"):
        r = client.post(f"/v2/plots?format={fmt}&kind=waterfall", json=body)
        assert r.status_code == 400, r.text
        assert r.json()["code"] == "invalid_input"


def test_waterfall_reads_like_shaps(client: TestClient, tabular: dict[str, Any]) -> None:
    """Labels 'value = feature', a title naming model, explainer, target and f(x), and
    E[f(x)] and f(x) marked."""
    e = tabular["data"]["explanations"][0]
    spec = client.post("/v2/plots?format=vega-lite&kind=waterfall", json=tabular).json()
    vega_lite_validator().validate(spec)
    from app.plots import num

    f_x = num(e["instance_output_value"])
    assert spec["title"]["text"] == f"diabetes-mlp · shapley · {e['output_name']} · f(x) = {f_x}"
    labels = {row["player"]: row["label"] for row in spec["data"]["values"]}
    assert labels["bmi"] == "25 = bmi" and labels["s5"] == "5 = s5"
    marks = [layer["data"]["values"][0]["label"] for layer in spec["layer"] if "data" in layer]
    assert marks[0].startswith("E[f(x)] = ") and marks[1].startswith("f(x) = ")
    bar = client.post("/v2/plots?format=vega-lite&kind=bar", json=tabular).json()
    vega_lite_validator().validate(bar)
    assert {row["label"] for row in bar["data"]["values"]} >= {"25 = bmi", "90 = bp"}


def test_heatmap_beside_the_original_with_top_classes(client: TestClient) -> None:
    body = {"inputs": [DIGIT], "parameters": {"patch_size": 2}}
    r = client.post("/v2/models/digits-cnn/explain/shapley/plot?format=vega-lite", json=body)
    spec = r.json()
    vega_lite_validator().validate(spec)
    original, overlay = spec["hconcat"]
    probs = client.post(
        "/v2/models/digits-cnn/infer",
        json={"inputs": [{"name": "input", "shape": [1, 8, 8], "datatype": "FP32",
                          "data": np.ravel(DIGIT).tolist()}]},
    )  # fmt: skip
    assert probs.status_code == 200, probs.text
    p = np.ravel(probs.json()["outputs"][0]["data"])
    best = np.argsort(-p)[:3]
    assert original["title"]["subtitle"] == " · ".join(f"{i}: {100 * p[i]:.1f}%" for i in best)
    assert overlay["title"] == "attributions"
    png = client.post("/v2/models/digits-cnn/explain/shapley/plot?format=png", json=body)
    image = Image.open(io.BytesIO(png.content))
    assert image.width > 1.5 * image.height  # two panels side by side


def test_text_plot_keeps_every_character(client: TestClient) -> None:
    from app import plot_images, plots
    from app.schemas import ExplainResponse

    sentence = "The food was wonderful, but the service was slow."
    body = explain(client, "sentiment-minilm", {"inputs": [sentence]})
    pieces = plot_images.segments(plots.view(ExplainResponse.model_validate(body), 0))
    assert "".join(p for p, _ in pieces) == sentence  # the final '.' included
    assert [p for p, v in pieces if v is not None] == [
        p["text"] for p in body["data"]["explanations"][0]["players"]
    ]
    svg = client.post("/v2/plots?format=svg", json=body)
    assert svg.status_code == 200 and b"red raises the output" in svg.content  # the legend
    assert client.post("/v2/plots?format=png", json=body).status_code == 200


@pytest.mark.parametrize(
    ("x", "text"),
    [(10140.0, "10140"), (1.5, "1.5"), (2e5, "2.00e+05"), (151.23, "151.2"), (0.508, "0.508")],
)
def test_numbers_people_read(x: float, text: str) -> None:
    from app.plots import num

    assert num(x) == text


# ----------------------------------------------------------------------------- RGB images


@pytest.fixture(scope="module")
def rgb_client(make_client: Callable[..., TestClient]) -> TestClient:
    """A server where a 3×16×16 RGB CNN is registered over HTTP (tests/image_models.py)."""
    from tests import image_models as im

    c = make_client()
    r = c.post("/v2/repository/models", data=im.image_form("rgb-16", 3, 16),
               files={"file": ("rgb.pt", im.torchscript_bytes(im.rgb_cnn(3, 16)))})  # fmt: skip
    assert r.status_code == 201, r.text
    return c


RED, GREEN = (0.9, 0.1, 0.1), (0.1, 0.8, 0.1)


def plain(rgb: tuple[float, float, float], size: int = 16) -> list[Any]:
    """A 3×size×size image of one colour, channels first."""
    return [[[v] * size for _ in range(size)] for v in rgb]


def answer(
    data: Any, names: list[str], values: list[float], parameters: dict[str, Any],
    details: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """An explain answer with these values (what the plot routes take)."""
    e = {"output_index": 0, "output_name": "class_0", "data": data, "values": values,
         "base_value": 0.0, "instance_output_value": float(sum(values)),
         "approximation_error": 0.0, "details": details, "warnings": [], "exact": True,
         "estimator": "exact", "n_model_evals": 1}  # fmt: skip
    meta = {"explainer": "shapley", "explainer_version": "1", "seed": 0, "budget": 1,
            "n_model_evals": 1, "n_instances": 1, "exact": True, "additive": True,
            "compute_ms": 1.0, "cache": "miss", "parameters": parameters}  # fmt: skip
    data = {"feature_names": names, "output_names": ["class_0"], "explanations": [e]}
    return {"model_name": "none", "model_version": "0", "id": "", "meta": meta, "data": data}


def rendered(client: TestClient, body: dict[str, Any], query: str = "") -> tuple[np.ndarray, Any]:
    """The route's PNG as RGB [rows, cols, 3] in [0, 1], and the same figure built here (to map
    image pixels to PNG pixels through its axes)."""
    from app import plot_images
    from app.schemas import ExplainResponse

    r = client.post(f"/v2/plots?format=png{query}", json=body)
    assert r.status_code == 200, r.text
    png = np.asarray(Image.open(io.BytesIO(r.content)).convert("RGB"), dtype=float) / 255
    channels = dict(p.split("=") for p in query.strip("&").split("&") if p).get("channels", "sum")
    fig = plot_images.figure(ExplainResponse.model_validate(body), "auto", 0, 20, None, channels)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()  # the layout savefig uses (aspect applied), at dpi 100
    assert png.shape[:2] == (int(fig.bbox.height), int(fig.bbox.width))
    return png, fig


def at(png: np.ndarray, fig: Any, panel: int, r: float, c: float) -> np.ndarray:
    """The PNG's colour at image pixel (r, c) of an image panel (0: the input); imshow puts
    pixel centres on integer data coordinates."""
    x, y = fig.axes[panel].transData.transform((c, r))
    return png[round(png.shape[0] - y), round(x)]


def test_rgb_patches_in_colour_with_the_hottest_patch_where_the_values_say(
    rgb_client: TestClient,
) -> None:
    names = [f"patch_{r}_{c}" for r in range(4) for c in range(4)]
    values = [0.0] * 16
    values[names.index("patch_1_2")] = 1.0  # rows 4-7, columns 8-11
    values[names.index("patch_3_0")] = -0.6
    body = answer(plain(RED), names, values, {"patch_size": 4})
    png, fig = rendered(rgb_client, body)
    for r, c in ((0, 0), (10, 14), (15, 7)):  # the input: red everywhere
        red, green, blue = at(png, fig, 0, r, c)
        assert red > 0.8 and green < 0.2 and blue < 0.2
    for r, c in ((0, 0), (10, 14)):  # attributions ~0: the paler input, still red
        red, green, blue = at(png, fig, 1, r, c)
        assert red > 0.9 and red - green > 0.25 and abs(green - blue) < 0.05
    hot, cold, calm = at(png, fig, 1, 5, 9), at(png, fig, 1, 13, 1), at(png, fig, 1, 1, 1)
    assert np.abs(hot - calm).sum() > 0.4 and hot[1] < calm[1] - 0.3  # deep red, not pale
    assert cold[2] > cold[0] and cold[2] > 0.5  # blue lowers
    strongest = max(((r, c) for r in range(16) for c in range(16)),
                    key=lambda p: 1 - at(png, fig, 1, *p)[1])  # fmt: skip
    assert (strongest[0] // 4, strongest[1] // 4) == (1, 2)
    spec = rgb_client.post("/v2/plots?format=vega-lite", json=body).json()
    vega_lite_validator().validate(spec)
    cells = {(row["row"], row["col"]): row for row in spec["data"]["values"]}
    assert cells[(0, 0)]["rgb"] == "#e61a1a" and cells[(5, 9)]["value"] == 1.0


def test_superpixels_painted_per_segment_with_their_boundaries(rgb_client: TestClient) -> None:
    from app.plots import segment_labels, view
    from app.schemas import ExplainResponse

    labels = np.zeros((16, 16), dtype=int)  # quadrants: 0 1 / 2 3
    labels[:, 8:] += 1
    labels[8:, :] += 2
    flat = labels.ravel()
    cuts = np.flatnonzero(np.diff(flat)) + 1
    starts = np.concatenate([[0], cuts])
    lengths = np.diff(np.concatenate([starts, [flat.size]]))
    rle = [int(x) for pair in zip(flat[starts], lengths, strict=True) for x in pair]
    details = {"segments": {"shape": [16, 16], "rle": rle}}
    body = answer(plain(GREEN), [f"superpixel_{k}" for k in range(4)], [1.0, 0.0, -1.0, 0.0],
                  {}, details)  # fmt: skip
    v = view(ExplainResponse.model_validate(body), 0)
    np.testing.assert_array_equal(segment_labels(v, 16, 16), labels)
    png, fig = rendered(rgb_client, body)
    top_left, top_right = at(png, fig, 1, 3, 3), at(png, fig, 1, 3, 12)
    bottom_left = at(png, fig, 1, 12, 3)
    assert top_left[0] > top_left[1] + 0.3  # +1: red
    assert bottom_left[2] > bottom_left[1] + 0.2  # -1: blue
    assert top_right[1] > top_right[0] + 0.2 and top_right[1] > top_right[2] + 0.2  # 0: green
    for panel in (0, 1):  # the boundary pixels beside the cut at column 8, in yellow
        edge = at(png, fig, panel, 12, 7)
        assert edge[0] > 0.8 and edge[1] > 0.7 and edge[2] < 0.3, edge
    spec = rgb_client.post("/v2/plots?format=vega-lite", json=body).json()
    vega_lite_validator().validate(spec)
    cells = {(row["row"], row["col"]): row for row in spec["data"]["values"]}
    assert cells[(3, 3)]["value"] == 1.0 and cells[(12, 3)]["value"] == -1.0
    assert cells[(12, 7)]["edge"] and not cells[(3, 3)]["edge"]
    bad = {**details, "segments": {"shape": [16, 16], "rle": [0, 255]}}  # one pixel short
    body["data"]["explanations"][0]["details"] = bad
    r = rgb_client.post("/v2/plots?format=png", json=body)
    assert r.status_code == 400 and "segments" in r.json()["error"]


def test_pixel_attributions_per_channel_or_summed(rgb_client: TestClient) -> None:
    from tests import image_models as im

    x = im.images(1, 3, 16, seed=3)[0]
    body = {"inputs": [x.tolist()], "budget": 64}
    out = rgb_client.post("/v2/models/rgb-16/explain/integrated-gradients", json=body)
    assert out.status_code == 200, out.text
    answer_ = out.json()
    planes = np.asarray(answer_["data"]["explanations"][0]["values"]).reshape(3, 16, 16)
    summed = rgb_client.post("/v2/plots?format=vega-lite", json=answer_).json()
    each = rgb_client.post("/v2/plots?format=vega-lite&channels=each", json=answer_).json()
    green = rgb_client.post("/v2/plots?format=vega-lite&channels=g", json=answer_).json()
    for spec in (summed, each, green):
        vega_lite_validator().validate(spec)
    assert len(summed["hconcat"]) == 2 and len(each["hconcat"]) == 4
    assert [p["title"] for p in each["hconcat"][1:]] == [
        f"attributions ({c} channel)" for c in "rgb"
    ]
    for r, c in ((0, 0), (7, 11), (15, 3)):
        cell = summed["data"]["values"][16 * r + c]
        assert (cell["row"], cell["col"]) == (r, c)
        assert cell["value"] == pytest.approx(planes[:, r, c].sum())
        cell = each["data"]["values"][16 * r + c]
        assert [cell[f"value_{k}"] for k in "rgb"] == pytest.approx(planes[:, r, c].tolist())
        assert green["data"]["values"][16 * r + c]["value"] == pytest.approx(planes[1, r, c])
        want = "#{:02x}{:02x}{:02x}".format(*np.round(255 * x[:, r, c]).astype(int))
        assert cell["rgb"] == want  # the input's colour, on the model's input_range [0, 1]
    png, fig = rendered(rgb_client, answer_, "&channels=each")
    assert len([ax for ax in fig.axes if ax.images]) == 4  # the input and three channels
    red, green_, blue = at(png, fig, 0, 8, 8)
    np.testing.assert_allclose([red, green_, blue], x[:, 8, 8], atol=0.02)  # in colour
    shapley = rgb_client.post("/v2/models/rgb-16/explain/shapley",
                              json={**body, "parameters": {"patch_size": 8}}).json()  # fmt: skip
    refused = rgb_client.post("/v2/plots?format=png&channels=r", json=shapley)
    assert refused.status_code == 400 and "channels=sum" in refused.json()["error"]
    refused = rgb_client.post("/v2/models/rgb-16/explain/shapley/plot?format=png&channels=b",
                              json={**body, "parameters": {"patch_size": 8}})  # fmt: skip
    assert refused.status_code == 400
    refused = rgb_client.post("/v2/plots?format=png&channels=x", json=shapley)
    assert refused.status_code == 422


def test_superpixels_of_a_real_explanation(rgb_client: TestClient) -> None:
    from app.plots import segment_labels, view
    from app.schemas import ExplainResponse
    from tests import image_models as im

    x = im.images(1, 3, 16, seed=4)[0].tolist()
    body = {"inputs": [x], "parameters": {"players": "superpixels", "n_segments": 8}}
    out = rgb_client.post("/v2/models/rgb-16/explain/shapley", json=body)
    assert out.status_code == 200, out.text
    real = out.json()
    labels = segment_labels(view(ExplainResponse.model_validate(real), 0), 16, 16)
    assert labels is not None
    values = np.asarray(real["data"]["explanations"][0]["values"])
    spec = rgb_client.post("/v2/plots?format=vega-lite", json=real).json()
    vega_lite_validator().validate(spec)
    for cell in spec["data"]["values"]:  # every pixel painted with its superpixel's value
        assert cell["value"] == pytest.approx(values[labels[cell["row"], cell["col"]]])
    assert any(cell["edge"] for cell in spec["data"]["values"])
    png = rgb_client.post("/v2/plots?format=png", json=real)
    assert png.status_code == 200 and Image.open(io.BytesIO(png.content)).format == "PNG"


@pytest.mark.parametrize("targets", [{}, {"output_names": []}, {"output_names": ["a", "b", "c"]}])
def test_shap_arguments_of_a_bad_targets_block_are_a_400(
    client: TestClient, tabular: dict[str, Any], targets: dict[str, Any]
) -> None:
    """Issue 39: meta.targets without usable output_names (sent back to POST /v2/plots) was a
    500; it is a 400 naming the field (3 names do not divide 2 explanations)."""
    body = {**tabular, "meta": {**tabular["meta"], "targets": targets}}
    r = client.post("/v2/plots?format=shap", json=body)
    assert r.status_code == 400, r.text
    assert "meta.targets needs output_names" in r.json()["error"]
