#!/usr/bin/env bash
# Idempotent: the peer clients the OIP tests run (tritonclient's HTTP client, the KServe SDK) in
# a virtualenv of their own, .peers/clients: they pin fastapi/pydantic/numpy versions that may
# differ from ours. The tests start them as subprocesses. Never installs torch.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=.peers/clients
PINS=("tritonclient[http]==2.73.0" "kserve==0.21.0")
want=$(printf '%s\n' "${PINS[@]}" | sha256sum | cut -d' ' -f1)
stamp=$VENV/.requirements.sha256
if [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
    echo "setup_peers: creating $VENV"
    mkdir -p .peers
    "$PY" -m venv "$VENV"
fi
echo "setup_peers: installing ${PINS[*]} into $VENV"
# An unsatisfiable constraint: resolution fails instead of pulling in torch.
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
printf 'torch<0\n' > "$constraints"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -c "$constraints" "${PINS[@]}"
if "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)"; then
    echo "setup_peers: torch ended up in $VENV; refusing" >&2
    exit 1
fi
echo "$want" > "$stamp"
