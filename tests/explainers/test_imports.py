"""The library's games and estimators import no torch (DESIGN.md 2: heavy libraries where they
are used), each module on its own in a fresh interpreter (so no import order hides a cycle)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXPLAINERS = Path(__file__).resolve().parents[2] / "explainers"
HEAVY = ("torch", "transformers", "sklearn", "shapiq")


def _modules() -> list[str]:
    found = ["explainers.estimators", "explainers.games"]
    for package in ("estimators", "games"):
        found += [
            f"explainers.{package}.{path.stem}"
            for path in sorted((EXPLAINERS / package).glob("*.py"))
            if path.stem != "__init__"
        ]
    return found


def test_the_packages_are_listed() -> None:
    mods = _modules()
    assert {"explainers.estimators.surrogate", "explainers.games.spans"} <= set(mods)


@pytest.mark.parametrize("module", _modules())
def test_imports_no_torch(module: str) -> None:
    code = f"import sys, {module}; print([m for m in {HEAVY!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", (module, out.stdout)
