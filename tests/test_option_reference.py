"""docs/options.md is what scripts/option_reference.py writes from the explainer registry."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from explainers.registry import EXPLAINERS

ROOT = Path(__file__).resolve().parents[1]


def test_the_option_reference_is_current() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "option_reference.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def test_the_reference_names_every_explainer_and_option() -> None:
    page = (ROOT / "docs" / "options.md").read_text()
    for spec in EXPLAINERS:
        assert f"## `{spec.name}` (version {spec.version})" in page
        for name in spec.options.model_fields:
            assert f"| `{name}` |" in page, (spec.name, name)
    assert '| `masker.type` | "background" \\| "baseline"' in page  # a nested model's fields
