#!/usr/bin/env bash
# Set up if needed, then serve on 127.0.0.1:8000 with embedded defaults (in-process cache).
# Extra arguments go to `python -m app` (e.g. --port 9000). REDIS_URL enables the Redis cache.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m app --host 127.0.0.1 --port 8000 "$@"
