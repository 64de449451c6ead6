"""The web explorer in headless Chromium (Debian's, driven by Playwright; no browser download)
against a real server: a tabular explanation, an image heatmap and a text highlight render with
the service's own numbers and no console errors; a job shows its progress. Screenshots go to
tests/artifacts/ (ignored by git, kept by CI as artifacts)."""

from __future__ import annotations

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
    page.page.fill("#budget", "256")
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
