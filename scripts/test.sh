#!/usr/bin/env bash
# Set up if needed, make sure Redis answers on 127.0.0.1:6379, then lint, type-check and test.
# Extra arguments go to pytest (e.g. -k cache).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Peers the tests talk to, each in a virtualenv of its own (they pin other fastapi/pydantic
# versions): tritonclient and the KServe SDK (.peers/clients), MLServer (.peers/mlserver).
scripts/setup_peers.sh
scripts/setup_mlserver.sh

redis_up() { .venv/bin/python -c "import redis,sys; redis.Redis(port=6379, socket_connect_timeout=1).ping()" 2>/dev/null; }
if ! redis_up; then
    echo "test: starting redis-server on 127.0.0.1:6379"
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
        --logfile /tmp/attribution-redis.log
    for _ in $(seq 50); do redis_up && break; sleep 0.1; done
fi
export REDIS_TEST_URL=${REDIS_TEST_URL:-redis://127.0.0.1:6379/15}

# PostgreSQL for the job-store tests (the Debian cluster this machine kind ships).
if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
    if command -v pg_ctlcluster >/dev/null 2>&1; then
        echo "test: starting PostgreSQL"
        pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
    else
        echo "setup: installing PostgreSQL from Debian packages"
        apt-get update -qq && apt-get install -y -qq postgresql >/dev/null
        pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
    fi
    for _ in $(seq 50); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.2; done
fi

.venv/bin/ruff check app explainers models tests bench
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
