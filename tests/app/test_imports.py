"""The server never imports the client package: xai/ is installed without the server, and the
server keeps its own rules (app/jobs/results.py, app/plot_shap.py)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_the_server_does_not_import_the_client() -> None:
    files = sorted((ROOT / "app").rglob("*.py"))
    assert len(files) > 20  # the scan sees the server
    users = {
        str(p.relative_to(ROOT)): hits
        for p in files
        if (hits := {m for m in _imported(p) if m == "xai" or m.startswith("xai.")})
    }
    assert users == {}
