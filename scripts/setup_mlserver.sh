#!/usr/bin/env bash
# Idempotent set-up of .peers/mlserver: MLServer with its scikit-learn runtime, in a virtualenv of
# its own (MLServer pins fastapi/pydantic ranges of its own; it runs as a separate process in the
# tests). scikit-learn, numpy, scipy, joblib and threadpoolctl are taken from requirements.lock, so
# a model trained in .venv and saved with joblib loads unchanged here. Never installs torch.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.peers/mlserver
PINS=(mlserver==1.7.1 mlserver-sklearn==1.7.1 pandas==2.3.3)
for pkg in scikit-learn numpy scipy joblib threadpoolctl; do
    pin=$(grep -ioE "^${pkg}==[^ ;\\]+" requirements.lock || true)
    if [ -z "$pin" ]; then
        echo "setup_mlserver: $pkg is not pinned in requirements.lock" >&2
        exit 1
    fi
    PINS+=("$pin")
done
# Everything else they pull in, pinned too (pip freeze of a working install): a constraints file.
LOCKED=(
    aiofiles==25.1.0
    aiohappyeyeballs==2.7.1
    aiohttp==3.14.5
    aiokafka==0.14.0
    aiosignal==1.4.0
    annotated-types==0.8.0
    anyio==4.16.0
    asgiref==3.13.0
    async-timeout==5.0.1
    attrs==26.1.0
    brotli==1.2.1
    certifi==2026.10.19.post1
    click==8.5.1
    cloudpickle==3.1.3
    fastapi==0.115.14
    frozenlist==1.8.0
    gevent==26.9.0
    geventhttpclient==2.6.1
    googleapis-common-protos==1.76.0
    greenlet==3.3.2
    grpcio==1.85.3
    h11==0.16.0
    idna==3.20
    importlib_resources==6.5.2
    ml_dtypes==0.5.4
    multidict==7.2.1
    narwhals==2.29.0
    opentelemetry-api==1.45.2
    opentelemetry-exporter-otlp-common==0.66b2
    opentelemetry-exporter-otlp-proto-common==1.45.2
    opentelemetry-exporter-otlp-proto-grpc==1.45.2
    opentelemetry-instrumentation==0.66b2
    opentelemetry-instrumentation-asgi==0.66b2
    opentelemetry-instrumentation-fastapi==0.66b2
    opentelemetry-instrumentation-grpc==0.66b2
    opentelemetry-proto==1.45.2
    opentelemetry-sdk==1.45.2
    opentelemetry-semantic-conventions==0.66b2
    opentelemetry-util-http==0.66b2
    orjson==3.13.0
    packaging==26.4
    prometheus_client==0.26.0
    propcache==0.5.4
    protobuf==6.33.6
    py-grpc-prometheus==0.8.0
    pydantic==2.14.4
    pydantic-settings==2.16.3
    pydantic_core==2.50.5
    python-dateutil==4.0.0
    python-dotenv==1.2.4
    python-multipart==0.0.34
    python-rapidjson==1.25
    pytz==2026.6
    starlette==0.46.2
    starlette_exporter==0.24.0
    tritonclient==2.73.0
    typing-inspection==0.4.5
    typing_extensions==4.16.0
    tzdata==2026.6
    urllib3==2.8.0
    uvicorn==0.54.0
    uvloop==0.23.0
    wrapt==2.5.2
    yarl==1.25.1
    zope.event==6.2
    zope.interface==8.7
)

PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
    echo "setup_mlserver: creating $VENV"
    mkdir -p .peers
    "$PY" -m venv "$VENV"
fi
stamp=$VENV/.requirements.sha256
want=$(printf '%s\n' "${PINS[@]}" "${LOCKED[@]}" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "setup_mlserver: installing ${PINS[*]} into $VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    constraints=$(mktemp)
    trap 'rm -f "$constraints"' EXIT
    printf '%s\n' "${LOCKED[@]}" > "$constraints"
    "$VENV/bin/python" -m pip install -q -c "$constraints" "${PINS[@]}"
    if "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)"; then
        echo "setup_mlserver: torch was pulled into $VENV; refusing" >&2
        exit 1
    fi
    "$VENV/bin/mlserver" --help >/dev/null
    echo "$want" > "$stamp"
fi
