"""The models package has no import cycles, and its protocol for AttriBoT imports no torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

MODELS = Path(__file__).resolve().parents[2] / "models"


def _module(path: Path) -> str:
    """`builtin/lm.py` -> "builtin.lm" (relative to models/)."""
    return ".".join(path.relative_to(MODELS).with_suffix("").parts)


def _imports() -> dict[str, set[str]]:
    """Module -> the models modules it imports (TYPE_CHECKING and function-local included): the
    core at the top, builtin/ and adapters/ (the sandbox, models/sandbox/, is not walked)."""
    paths = [
        p for p in sorted(MODELS.rglob("*.py")) if p.stem != "__init__" and "sandbox" not in p.parts
    ]
    known = {_module(p) for p in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            deps |= {n.removeprefix("models.") for n in names if n.startswith("models.")}
        graph[_module(path)] = deps & known
    return graph


def test_no_import_cycles() -> None:
    graph = _imports()
    families = {"builtin.trained", "builtin.encoders", "builtin.rankers", "builtin.lm"}
    assert {"catalog", "adapters.user", *families} <= set(graph)

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
    assert {*families, "builtin.text"} <= graph["catalog"]
    assert "catalog" not in set().union(*(d for m, d in graph.items() if m != "registry"))
    # the core does not reach into the shipped models or the users' formats
    core = [m for m in graph if "." not in m and m not in ("catalog", "registry")]
    assert not {d for m in core for d in graph[m] if "." in d}, core


def test_language_model_protocol_imports_no_torch() -> None:
    code = (
        "import sys\nfrom models.lm_protocol import LanguageModelProtocol\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)[:5]"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=MODELS.parent, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
