"""The models package has no import cycles, and its protocol for AttriBoT imports no torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

MODELS = Path(__file__).resolve().parents[2] / "models"


def _imports() -> dict[str, set[str]]:
    """Module -> the models modules it imports (TYPE_CHECKING and function-local included)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(MODELS.glob("*.py")):
        if path.stem == "__init__":
            continue
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            deps |= {n.split(".")[1] for n in names if n.startswith("models.")}
        graph[path.stem] = deps
    return graph


def test_no_import_cycles() -> None:
    graph = _imports()
    assert {"catalog", "builtin", "encoders", "rankers", "lm"} <= set(graph)

    def reaches(start: str) -> set[str]:
        seen: set[str] = set()
        todo = list(graph[start])
        while todo:
            node = todo.pop()
            if node not in seen:
                seen.add(node)
                todo += graph.get(node, ())
        return seen

    cycles = sorted(m for m in graph if m in reaches(m))
    assert cycles == []
    # only the catalog knows every family
    assert {"builtin", "encoders", "rankers", "lm", "text"} <= graph["catalog"]
    assert "catalog" not in set().union(*(d for m, d in graph.items() if m != "registry"))


def test_language_model_protocol_imports_no_torch() -> None:
    code = (
        "import sys\nfrom models.lm_protocol import LanguageModelProtocol\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)[:5]"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=MODELS.parent, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
