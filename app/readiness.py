"""Readiness across the API processes of one `python -m app`.

The processes share one listening socket, so a probe reaches any of them: one process saying
"ready" while another still loads its models would send traffic to a process that answers
"not ready" next. Each process marks itself ready in a folder the supervisor made
(ATTRIBUTION_READY_DIR, one file per pid); the service is ready once ATTRIBUTION_PROCESSES
live processes have marked it. A single process has neither variable and answers for itself,
and so does each process when models load on first use (LOAD_MODELS_ON_START=false).

The readiness route is public: without a valid API key (when keys are configured) its body
counts models by state instead of naming them (`public_body`), so a probe learns whether the
service is ready, not which models it serves.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from app.auth import parse_keys

READY_DIR_ENV = "ATTRIBUTION_READY_DIR"
PROCESSES_ENV = "ATTRIBUTION_PROCESSES"


def missing_models(status: dict[str, dict[str, object]]) -> list[str]:
    """The models readiness waits for that are not loaded (background ones never count)."""
    return [n for n, st in status.items() if not st["loaded"] and not st.get("background")]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def mark_ready() -> None:
    """Record that this process has every model readiness waits for (idempotent)."""
    folder = os.environ.get(READY_DIR_ENV)
    if folder:
        mark = Path(folder) / str(os.getpid())
        if not mark.exists():
            mark.touch()


def processes_waiting() -> tuple[int, int] | None:
    """(processes ready, processes expected) while some sibling process is not ready yet;
    None when all are (or this is the only process)."""
    folder, expected = os.environ.get(READY_DIR_ENV), os.environ.get(PROCESSES_ENV, "")
    if not folder or not expected.isdigit():
        return None
    pids = [int(p.name) for p in Path(folder).iterdir() if p.name.isdigit()]
    ready = sum(1 for pid in pids if _alive(pid))
    return None if ready >= int(expected) else (ready, int(expected))


def model_counts(status: dict[str, dict[str, object]]) -> dict[str, int]:
    """How many models are loaded, loading (not loaded, no error yet) and failed."""
    loaded = sum(1 for st in status.values() if st["loaded"])
    failed = sum(1 for st in status.values() if not st["loaded"] and st.get("error"))
    return {"loaded": loaded, "loading": len(status) - loaded - failed, "failed": failed}


def public_body(body: dict[str, Any], missing: list[str]) -> dict[str, Any]:
    """A readiness body without model names (nor their load errors, which may hold paths):
    `models` becomes counts, "models not loaded" says how many, and the cache's state is
    up or down without its error (which names the Redis address)."""
    out = {**body, "models": model_counts(body["models"])}
    out["cache"] = {k: v for k, v in body["cache"].items() if k in ("backend", "ok")}  # no address
    if out.get("code") == "not_ready" and missing:
        out["error"] = f"models not loaded: {len(missing)}"
    return out


@lru_cache(maxsize=4)
def _keys_configured(api_keys: str | None) -> bool:
    return bool(parse_keys(api_keys))


def may_name_models(api_keys: str | None, key: object | None) -> bool:
    """Whether the readiness body may name models: a valid key came (app/auth.py sets it on
    public routes too), or no keys are configured (everything is open anyway)."""
    return key is not None or not _keys_configured(api_keys)
