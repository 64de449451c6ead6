#!/usr/bin/env bash
# Set up if needed, make sure Redis answers on 127.0.0.1:6379, then lint, type-check and test.
# Extra arguments go to pytest (e.g. -k cache).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

redis_up() { .venv/bin/python -c "import redis,sys; redis.Redis(port=6379, socket_connect_timeout=1).ping()" 2>/dev/null; }
if ! redis_up; then
    echo "test: starting redis-server on 127.0.0.1:6379"
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
        --logfile /tmp/attribution-redis.log
    for _ in $(seq 50); do redis_up && break; sleep 0.1; done
fi
export REDIS_TEST_URL=${REDIS_TEST_URL:-redis://127.0.0.1:6379/15}

.venv/bin/ruff check app explainers models tests bench
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
