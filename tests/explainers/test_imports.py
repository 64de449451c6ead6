"""The layout's rules (DESIGN.md 2): the library's games and estimators import no torch (heavy
libraries where they are used), each module on its own in a fresh interpreter (so no import
order hides a cycle); dependencies point one way (app -> explainers -> models; games and
estimators below the families); explainers/ keeps only the contract and single-file families at
its top; dotted module names in strings (the sandbox's preload list) name modules that exist."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXPLAINERS = ROOT / "explainers"
HEAVY = ("torch", "transformers", "sklearn", "shapiq")
# The contract (explanation, options, context, registry, the masker option) and the families of
# one file; every other family is a package (shapley/, gradients/, amortized/, sufficient/,
# trust/) beside games/ and estimators/.
TOP = {
    "__init__",
    "attribot",
    "cocoa",
    "context",
    "explanation",
    "masking",
    "options",
    "rankshap",
    "registry",
}
PACKAGES = {"amortized", "estimators", "games", "gradients", "shapley", "sufficient", "trust"}


def _modules() -> list[str]:
    found = ["explainers.estimators", "explainers.games"]
    for package in ("estimators", "games"):
        found += [
            f"explainers.{package}.{path.stem}"
            for path in sorted((EXPLAINERS / package).glob("*.py"))
            if path.stem != "__init__"
        ]
    return found


def _imports(path: Path) -> Iterator[str]:
    """The absolute modules a file imports (at any level of the file: lazy imports count)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def _importers(folder: str, prefixes: tuple[str, ...]) -> dict[str, set[str]]:
    """Files under `folder` that import a module starting with one of `prefixes`, and what."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        hits = {m for m in _imports(path) if m.split(".")[0] in prefixes or m.startswith(prefixes)}
        if hits:
            found[str(path.relative_to(ROOT))] = hits
    return found


def test_the_packages_are_listed() -> None:
    mods = _modules()
    assert {"explainers.estimators.surrogate", "explainers.games.spans"} <= set(mods)
    assert {"explainers.estimators.budget", "explainers.estimators.mobius"} <= set(mods)


@pytest.mark.parametrize("module", _modules())
def test_imports_no_torch(module: str) -> None:
    code = f"import sys, {module}; print([m for m in {HEAVY!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", (module, out.stdout)


def test_the_top_of_explainers_is_the_contract_and_single_file_families() -> None:
    files = {p.stem for p in EXPLAINERS.glob("*.py")}
    folders = {p.name for p in EXPLAINERS.iterdir() if (p / "__init__.py").is_file()}
    assert files == TOP, files ^ TOP
    assert folders == PACKAGES, folders ^ PACKAGES


def test_dependencies_point_one_way() -> None:
    assert _importers("explainers", ("app", "xai", "worker")) == {}
    assert _importers("models", ("app", "xai", "worker", "explainers")) == {}
    lower = ("explainers.games", "explainers.estimators", "explainers.explanation", "models")
    for folder in ("explainers/games", "explainers/estimators"):
        for path, mods in _importers(folder, ("explainers",)).items():
            assert all(m.startswith(lower) for m in mods), (path, mods)


def test_the_server_does_not_draw_on_the_client_for_plots() -> None:
    """The server cuts tokens and rows itself (app/plot_shap.py, app/jobs/results.py): the
    client is installed on its own."""
    assert _importers("app", ("xai",)) == {}


def test_the_old_flat_paths_are_gone() -> None:
    """The shims (explainers/maskers.py, explainers/text.py) and the flat modules that moved
    into packages are imported by nothing, so nothing can keep them alive."""
    old = (
        "explainers.maskers",
        "explainers.text",
        "explainers.shapley_runs",
        "explainers.salvage_store",
        "explainers.budget",
        "explainers.mobius",
        "models.user",
        "models.hf",
    )
    for folder in ("app", "explainers", "models", "worker", "tests", "bench", "scripts"):
        for path, mods in _importers(folder, ("explainers", "models")).items():
            assert not {m for m in mods if m in old}, (path, mods)


def test_the_sandbox_preloads_modules_that_exist() -> None:
    """models/sandbox/worker.py names the modules a worker imports before its chroot by dotted
    name: each of ours must resolve (a stale name would only fail inside a worker)."""
    tree = ast.parse((ROOT / "models/sandbox/worker.py").read_text())
    names = next(
        [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "PRELOAD" for t in node.targets)
        and isinstance(node.value, ast.Tuple)
    )
    ours = [n for n in names if isinstance(n, str) and n.startswith(("models.", "explainers."))]
    assert len(ours) > 10
    assert [n for n in ours if importlib.util.find_spec(n) is None] == []
