"""The web explorer in headless Chromium (Debian's, driven by Playwright; no browser download)
against a real server: a tabular explanation, an image heatmap and a text highlight render with
the service's own numbers and no console errors; a job shows its progress. Screenshots go to
tests/artifacts/ (ignored by git, kept by CI as artifacts)."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
# The machine has no internet: without these Chromium keeps trying to reach Google's hosts.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-quic",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (scripts/setup.sh installs it)"
)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=CHROMIUM,
            args=FLAGS,
            headless=True,
            viewport={"width": 1400, "height": 1000},
        )
        yield context
        context.close()


class Page:
    """A page that records console errors and uncaught exceptions."""

    def __init__(self, context: Any) -> None:
        self.page = context.new_page()
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))

    def explain(self, url: str) -> None:
        self.page.goto(url)
        self.page.wait_for_selector("#explainer option", state="attached")
        self.page.click("#explain")
        self.page.wait_for_selector("#result[data-state=done]", timeout=60_000)

    def shot(self, name: str) -> None:
        ARTIFACTS.mkdir(exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


@pytest.fixture()
def page(browser: Any) -> Iterator[Page]:
    p = Page(browser)
    yield p
    p.page.close()


def values_of(page: Any, selector: str) -> list[float]:
    return [
        float(v) for v in page.eval_on_selector_all(selector, "ns => ns.map(n => n.dataset.value)")
    ]


def test_tabular_bars_and_waterfall(inprocess_server: str, page: Page) -> None:
    page.explain(f"{inprocess_server}/?model=diabetes-mlp&explainer=shapley")
    status = page.page.inner_text("#status")
    assert re.fullmatch(r"done in (\d+ ms|\d+\.\d s) \(cache \w+\)", status), status
    row = [
        float(v)
        for v in page.page.eval_on_selector_all("[data-feature]", "ns => ns.map(n => n.value)")
    ]
    answer = httpx.post(
        f"{inprocess_server}/v2/models/diabetes-mlp/explain/shapley", json={"inputs": [row]}
    ).json()
    want = answer["data"]["explanations"][0]["values"]
    shown = values_of(page.page, "[data-testid=bars] .bar")
    assert sorted(shown) == pytest.approx(sorted(want))  # the page draws the service's numbers
    assert page.page.locator("[data-testid=waterfall] .step").count() == len(want)
    assert page.page.get_by_text(answer["data"]["explanations"][0]["output_name"]).count() >= 1
    page.shot("tabular")
    assert page.errors == []


def test_image_heatmap(inprocess_server: str, page: Page) -> None:
    page.explain(f"{inprocess_server}/?model=digits-cnn&explainer=shapley")
    cells = values_of(page.page, "[data-testid=heatmap] .heat-cell")
    assert len(cells) == 64  # one overlay cell per pixel of the 8x8 digit
    patches = values_of(page.page, "[data-testid=bars] .bar")
    # patch_size 2 (the default): each patch value covers its 2x2 pixels
    assert sorted(set(round(v, 9) for v in cells)) == sorted(set(round(v, 9) for v in patches))
    assert any(abs(v) > 0 for v in cells)
    # the original beside the heatmap, with the model's three most probable classes
    assert page.page.locator("[data-testid=original]").count() == 1
    page.page.wait_for_function(
        "document.querySelector('[data-testid=top-classes]').textContent.includes('%')"
    )
    assert page.page.inner_text("[data-testid=top-classes]").count("%") == 3
    page.shot("image")
    assert page.errors == []


def test_text_highlight(inprocess_server: str, page: Page) -> None:
    page.page.goto(f"{inprocess_server}/?model=sentiment-minilm&explainer=shapley")
    page.page.wait_for_selector("#text-input")
    text = "A wonderful cast, but a dull plot."  # 7 words: 128 coalitions, exact
    page.page.fill("#text-input", text)
    page.page.click("#explain")
    page.page.wait_for_selector("#result[data-state=done]", timeout=60_000)
    highlight = page.page.locator("[data-testid=highlight]").first
    assert highlight.inner_text().strip() == text  # words in place, punctuation kept
    words = page.page.locator("[data-testid=highlight] .word")
    assert words.count() == 7
    assert [w.strip() for w in words.all_inner_texts()][:2] == ["A", "wonderful"]
    answer = httpx.post(
        f"{inprocess_server}/v2/models/sentiment-minilm/explain/shapley",
        json={"inputs": [text]},
        timeout=60,
    ).json()
    want = answer["data"]["explanations"][0]["values"]
    assert values_of(page.page, "[data-testid=highlight] .word") == pytest.approx(want)
    page.shot("text")
    assert page.errors == []


def test_job_progress(inprocess_server: str, page: Page) -> None:
    page.page.goto(f"{inprocess_server}/?model=breast-cancer-mlp&explainer=shapley")
    page.page.wait_for_selector("#next-example")
    # 80 coalitions over 100 background rows (256 would pay for 2: refused at submission)
    page.page.fill("#budget", "8000")
    page.page.click("#submit-job")
    page.page.wait_for_function("document.getElementById('status').textContent.includes('job')")
    job_id = page.page.inner_text("#status").split()[1]
    row = page.page.locator(f"tr[data-job='{job_id}']")
    row.wait_for(timeout=20_000)
    page.page.wait_for_selector(f"tr[data-job='{job_id}'][data-status=succeeded]", timeout=60_000)
    assert "1/1" in row.inner_text()
    page.shot("jobs")
    assert page.errors == []


def test_warnings_next_to_the_values(inprocess_server: str, page: Page) -> None:
    # 80 coalitions for 30 features over 100 background rows: the answer is noise, and says so.
    page.page.goto(f"{inprocess_server}/?model=breast-cancer-mlp&explainer=shapley")
    page.page.wait_for_selector("#explainer option", state="attached")
    page.page.fill("#budget", "8000")
    page.page.click("#explain")
    page.page.wait_for_selector("#result[data-state=done]", timeout=60_000)
    noisy = page.page.locator("[data-testid=warnings] [data-code=noisy_estimate]")
    assert noisy.count() == 1 and "standard error" in noisy.inner_text()
    page.shot("warnings")
    # An exact answer has nothing to warn about: no warning box at all.
    page.explain(f"{inprocess_server}/?model=diabetes-mlp&explainer=shapley")
    assert page.page.locator("[data-testid=warnings]").count() == 0
    assert page.errors == []


def test_landing_page_opens_on_a_tabular_model_with_its_example(
    inprocess_server: str, page: Page
) -> None:
    page.page.goto(inprocess_server)
    page.page.wait_for_selector("[data-feature]")
    assert page.page.input_value("#model") == "diabetes-mlp"
    row = page.page.eval_on_selector_all("[data-feature]", "ns => ns.map(n => n.value)")
    assert len(row) == 10 and all(v != "" for v in row)
    page.shot("landing")
    assert page.errors == []


def test_blank_or_invalid_numbers_are_refused_before_sending(
    inprocess_server: str, page: Page
) -> None:
    page.page.goto(f"{inprocess_server}/?model=diabetes-mlp&explainer=shapley")
    page.page.wait_for_selector("[data-feature=bmi]")
    sent: list[str] = []
    page.page.on("request", lambda r: sent.append(r.url) if "/explain/" in r.url else None)
    page.page.fill("[data-feature=bmi]", "")
    page.page.click("#explain")
    status = page.page.locator("#status")
    assert "bmi" in status.inner_text() and status.get_attribute("class") == "error"
    assert page.page.locator("[data-feature=bmi].invalid").count() == 1
    page.page.click("#budget")
    page.page.keyboard.type("1e")  # no number at all: the field's badInput, value ""
    page.page.fill("[data-feature=bmi]", "27")
    page.page.click("#explain")
    assert "budget" in status.inner_text()
    page.shot("form-error")
    assert sent == [] and page.page.get_attribute("#result", "data-state") == "empty"
    assert page.errors == []


def option_visible(page: Any, name: str) -> bool:
    return bool(page.locator(f"[data-role=option][data-name={name}]").is_visible())


def test_options_follow_the_model_and_evaluate(inprocess_server: str, page: Page) -> None:
    page.page.goto(f"{inprocess_server}/?model=diabetes-mlp&explainer=shapley")
    page.page.wait_for_selector("[data-feature]")
    page.page.click("#options-box summary")
    assert not option_visible(page.page, "patch_size") and not option_visible(page.page, "players")
    assert option_visible(page.page, "estimator")
    page.page.check("[data-metric=deletion]")
    with page.page.expect_request(lambda r: "/explain/shapley" in r.url) as request:
        page.page.click("#explain")
    assert json.loads(request.value.post_data or "{}")["parameters"]["evaluate"] == ["deletion"]
    page.page.wait_for_selector("#result[data-state=done]", timeout=60_000)
    assert page.page.get_by_text("evaluation:").count() >= 1
    page.shot("options-tabular")
    for model, shown, hidden in (
        ("digits-cnn", "patch_size", "players"),
        ("sentiment-minilm", "players", "patch_size"),
    ):
        page.page.goto(f"{inprocess_server}/?model={model}&explainer=shapley")
        page.page.wait_for_selector(f"[data-role=option][data-name={shown}]", state="attached")
        page.page.click("#options-box summary")
        assert option_visible(page.page, shown) and not option_visible(page.page, hidden)
    assert page.errors == []


def test_compare_two_explainers(inprocess_server: str, page: Page) -> None:
    from scipy import stats

    page.page.goto(f"{inprocess_server}/?model=diabetes-mlp&explainer=shapley")
    page.page.wait_for_selector("[data-feature]")
    row = [
        float(v)
        for v in page.page.eval_on_selector_all("[data-feature]", "ns => ns.map(n => n.value)")
    ]
    page.page.click("#compare-box summary")
    page.page.select_option("#compare-explainer", "integrated-gradients")
    page.page.click("#compare")
    page.page.wait_for_selector("#result[data-state=done]", timeout=60_000)
    sides = page.page.locator("[data-testid=compare] .side")
    assert sides.count() == 2
    answers = [
        httpx.post(
            f"{inprocess_server}/v2/models/diabetes-mlp/explain/{name}",
            json={"inputs": [row], "seed": 0, "parameters": {}},
            timeout=60,
        ).json()["data"]["explanations"][0]["values"]
        for name in ("shapley", "integrated-gradients")
    ]
    box = page.page.locator("[data-testid=agreement]")
    rho = stats.spearmanr(answers[0], answers[1]).statistic
    assert float(box.get_attribute("data-spearman") or "nan") == pytest.approx(rho, abs=1e-9)
    top = [set(sorted(range(10), key=lambda i: -abs(v[i]))[:5]) for v in answers]
    assert int(box.get_attribute("data-overlap") or -1) == len(top[0] & top[1])
    assert "Spearman" in box.inner_text()
    page.shot("compare")
    assert page.errors == []


def test_job_view(inprocess_server: str, page: Page) -> None:
    rows = httpx.get(f"{inprocess_server}/v2/models/diabetes-mlp/examples?n=30").json()
    job = httpx.post(
        f"{inprocess_server}/v2/jobs", json={"model": "diabetes-mlp", "inputs": rows["instances"]}
    ).json()
    page.page.goto(inprocess_server)
    row = page.page.locator(f"tr[data-job='{job['id']}'][data-status=succeeded]")
    row.wait_for(timeout=60_000)
    row.click()
    page.page.wait_for_selector("#job-view[data-state=done]", timeout=60_000)
    page.page.wait_for_function(
        "document.querySelectorAll('#job-view img[data-loaded=true]').length === 3",
        timeout=90_000,  # three matplotlib plots: slow when the machine is busy
    )
    view = page.page.locator("#job-view")
    assert "30 instances" in view.inner_text()
    assert page.page.locator("[data-testid=job-warnings]").count() == 1
    assert "Every instance explains progression" in page.page.inner_text("[data-testid=per-class]")
    assert "bootstrap resamples" in page.page.inner_text("[data-testid=stability]")
    with page.page.expect_download() as download:
        page.page.click("[data-testid=job-downloads] >> text=CSV")
    path = download.value.path()
    assert path is not None and Path(path).read_text().count("\n") == 31  # header + 30
    page.page.select_option("#dependence-feature", "s5")
    page.page.wait_for_function(
        "document.querySelectorAll('#job-view img[data-loaded=true]').length === 3",
        timeout=90_000,
    )
    assert page.page.get_attribute("#job-view img[alt='dependence plot']", "data-loaded") == "true"
    page.page.locator("#jobs-box").screenshot(path=str(ARTIFACTS / "job-view.png"))
    page.shot("job-page")
    assert page.errors == []


@pytest.fixture(scope="module")
def rgb_server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server where a 3×32×32 RGB CNN is registered over HTTP with 8 stored background
    images (tests/image_models.py), its user models in a temporary folder."""
    import io

    import numpy as np

    from tests import image_models as im
    from tests.conftest import running_server

    tmp = tmp_path_factory.mktemp("rgb-server")
    env = {
        "REDIS_URL": None,
        "MODEL_DIR": str(model_dir),
        "JOB_QUEUE": "inprocess",
        "DATABASE_URL": f"sqlite:///{tmp / 'jobs.db'}",
        "USER_MODEL_DIR": str(tmp / "user"),
    }
    with running_server(env) as url:
        background = io.BytesIO()
        np.save(background, im.images(8, 3, 32, seed=5))
        files = {"file": ("rgb.pt", im.torchscript_bytes(im.rgb_cnn(3, 32))),
                 "background": ("background.npy", background.getvalue())}  # fmt: skip
        r = httpx.post(f"{url}/v2/repository/models", data=im.image_form("rgb-32", 3, 32),
                       files=files, timeout=120)  # fmt: skip
        assert r.status_code == 201, r.text
        yield url


CANVAS_PIXELS = """(selector) => [...document.querySelectorAll(selector)].map((c) => {
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  return {width: c.width, height: c.height, data: Array.from(d)};
})"""


def canvases(page: Any, selector: str) -> list[Any]:
    """Each canvas's pixels as [rows, cols, RGB] in 0-255."""
    import numpy as np

    return [
        np.asarray(c["data"], dtype=float).reshape(c["height"], c["width"], 4)[..., :3]
        for c in page.evaluate(CANVAS_PIXELS, selector)
    ]


def colourful(pixels: Any, by: float = 40) -> float:
    """The share of pixels whose channels differ by more than `by` of 255 (not grey or black)."""
    return float(((pixels.max(axis=-1) - pixels.min(axis=-1)) > by).mean())


def test_rgb_model_in_colour_with_examples_upload_and_channels(
    rgb_server: str, page: Page, tmp_path: Path
) -> None:
    import numpy as np
    from PIL import Image

    examples = httpx.get(f"{rgb_server}/v2/models/rgb-32/examples?n=4").json()
    assert len(examples["instances"]) == 4 and examples["rows"] == 8
    p = page.page
    p.goto(f"{rgb_server}/?model=rgb-32&explainer=shapley")
    p.wait_for_selector("#explainer option", state="attached")
    p.wait_for_selector("#next-example")
    assert "null" not in p.inner_text("#input-box")
    p.click("#next-example")  # the first example is loaded already: this picks the second
    want = np.asarray(examples["instances"][1])  # [3, 32, 32] on the input_range [0, 1]
    (pad,) = canvases(p, "[data-testid=pad]")
    cell = pad.shape[0] // 32
    shown = pad[cell // 2 :: cell, cell // 2 :: cell][:32, :32]  # one sample per image pixel
    np.testing.assert_allclose(shown, 255 * want.transpose(1, 2, 0), atol=1.0)  # in colour
    assert colourful(shown) > 0.2
    p.click("#options-box summary")
    assert p.get_attribute("[data-role=option][data-name=patch_size]", "placeholder") != "null"
    p.fill("[data-role=option][data-name=patch_size]", "4")
    p.fill("#budget", "256")
    p.click("#explain")
    p.wait_for_selector("#result[data-state=done]", timeout=60_000)
    (original,) = canvases(p, "[data-testid=original]")
    (heat,) = canvases(p, "[data-testid=heatmap]")
    assert colourful(original) > 0.2 and colourful(heat) > 0.2 and heat.mean() > 40
    assert not np.allclose(original, heat)  # the attributions are drawn over the image
    p.wait_for_function(
        "document.querySelector('[data-testid=top-classes]').textContent.includes('%')"
    )
    assert "null" not in p.inner_text("main")
    page.shot("rgb")
    # integrated gradients: one value per pixel and channel, summed or per channel
    p.select_option("#explainer", "integrated-gradients")
    p.fill("#budget", "64")
    p.click("#explain")
    p.wait_for_selector("#result[data-state=done]", timeout=60_000)
    assert p.locator("[data-testid=heatmap]").count() == 1
    p.select_option("[data-testid=channels]", "each")
    channels = p.eval_on_selector_all(
        "[data-testid=heatmap]", "ns => ns.map(n => n.dataset.channel)"
    )
    assert channels == ["r", "g", "b"]
    red, green, blue = canvases(p, "[data-testid=heatmap]")
    assert all(colourful(c, 15) > 0.2 for c in (red, green, blue))
    assert np.abs(red - green).mean() > 1 and np.abs(green - blue).mean() > 1  # each its own
    page.shot("rgb-channels")
    # an upload is scaled to the model's 32×32 and read as channels-first floats in [0, 1]
    picture = np.zeros((40, 50, 3), dtype=np.uint8)
    picture[:, :25] = (255, 0, 0)
    picture[:, 25:] = (0, 0, 255)
    path = tmp_path / "halves.png"
    Image.fromarray(picture).save(path)
    p.set_input_files("[data-testid=upload]", str(path))
    p.wait_for_function(
        "document.querySelector('[data-testid=pad]').dataset.loaded === 'halves.png'"
    )
    sent = np.asarray(p.evaluate("document.querySelector('[data-testid=pad]').readValue()"))
    assert sent.shape == (3, 32, 32)
    red_half, blue_half = np.zeros((3, 32, 14)), np.zeros((3, 32, 14))
    red_half[0], blue_half[2] = 1.0, 1.0
    np.testing.assert_allclose(sent[:, :, :14], red_half, atol=0.02)
    np.testing.assert_allclose(sent[:, :, 18:], blue_half, atol=0.02)
    assert page.errors == []
