"""Container files, checked without a Docker engine: hadolint on the Dockerfile, the compose
file against the Compose Specification's JSON schema (check-jsonschema's vendored copy), and the
facts the issue asks for (multi-stage, non-root, health checks, the README's requirement file,
only settings the service knows)."""

from __future__ import annotations

import collections
import http.server
import importlib.util
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import yaml

from app.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "docker" / "compose.yaml"
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    found = shutil.which(name, path=str(BIN)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed; run scripts/setup.sh")
    return found


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("hadolint"), "--no-color", str(path)], capture_output=True, text=True, timeout=60
    )


def compose_check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_hadolint_passes_on_the_dockerfile() -> None:
    result = hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


def test_hadolint_flags_a_bad_dockerfile(tmp_path: Path) -> None:
    """The linter really lints: an unpinned base image and apt without cleanup are reported."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN apt-get update && apt-get install -y curl\nUSER root\n")
    result = hadolint(bad)
    assert result.returncode != 0
    for rule in ("DL3006", "DL3008", "DL3015", "DL3002"):
        assert rule in result.stdout, result.stdout


def test_compose_file_follows_the_compose_spec() -> None:
    result = compose_check(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_schema_check_rejects_mistakes(tmp_path: Path) -> None:
    bad = tmp_path / "compose.yaml"
    bad.write_text("services:\n  api:\n    image: x\n    helthcheck:\n      test: [CMD, true]\n")
    result = compose_check(bad)
    assert result.returncode != 0 and "helthcheck" in result.stdout + result.stderr


def stages(text: str) -> list[list[str]]:
    """Dockerfile instructions per stage (continuation lines joined)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    out: list[list[str]] = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            out.append([])
        if out:
            out[-1].append(line)
    return out


def test_dockerfile_is_multi_stage_non_root_and_installs_the_lock_file() -> None:
    text = DOCKERFILE.read_text()
    build, runtime = stages(text)[0], stages(text)[-1]
    assert len(stages(text)) >= 2
    assert any("--from=build" in line for line in runtime if line.startswith("COPY"))
    users = [line.split()[1] for line in runtime if line.startswith("USER ")]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    install = " ".join(line for line in build if line.startswith("RUN"))
    # the same requirement file and torch pin as scripts/setup.sh (the README's set-up)
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert "torch==2.13.0 -r requirements.lock" in setup
    assert "torch==2.13.0 -r requirements.lock" in install
    assert any(line.startswith("HEALTHCHECK") for line in runtime)
    # every package directory of the project is in the image
    for package in ("app", "explainers", "models", "worker", "xai"):
        assert f"COPY {package} ./{package}" in text
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def test_compose_services_have_health_checks_and_wait_for_backends() -> None:
    services = compose()["services"]
    assert set(services) >= {"api", "worker", "redis", "postgres"}
    for name, service in services.items():
        assert service.get("healthcheck", {}).get("test"), f"{name} has no health check"
    for name in ("api", "worker"):
        needs = services[name]["depends_on"]
        assert needs["redis"]["condition"] == "service_healthy"
        assert needs["postgres"]["condition"] == "service_healthy"
    api_check = " ".join(services["api"]["healthcheck"]["test"])
    assert "/v2/health/ready" in api_check


def test_compose_environment_names_only_known_settings() -> None:
    """A typo in a variable name would silently fall back to a default: every variable the
    api and worker get must be a field of app.settings.Settings."""
    # plus uvicorn's own: whom to trust for X-Forwarded-For (the balancer)
    known = {name.upper() for name in Settings.model_fields} | {"FORWARDED_ALLOW_IPS"}
    services = compose()["services"]
    for name in ("api", "worker"):
        env = services[name]["environment"]
        assert set(env) <= known, set(env) - known
        assert env["JOB_QUEUE"] == "celery" and env["DATABASE_URL"].startswith(
            "postgresql+psycopg://"
        )
    postgres = services["postgres"]["environment"]
    url = services["api"]["environment"]["DATABASE_URL"]
    assert f"{postgres['POSTGRES_USER']}:{postgres['POSTGRES_PASSWORD']}@postgres:5432/" in url
    assert url.endswith("/" + postgres["POSTGRES_DB"])


# --- the load balancer (docker/nginx.conf, service lb) -------------------------------------

NGINX_CONF = ROOT / "docker" / "nginx.conf"


def nginx() -> str:
    found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")
    if found is None:
        pytest.fail("nginx is not installed; run scripts/setup.sh (Debian's nginx-light)")
    return found


def nginx_test(conf: Path, prefix: Path) -> subprocess.CompletedProcess[str]:
    """`nginx -t` on a whole configuration file, with pid and error log kept under prefix."""
    return subprocess.run(
        [
            nginx(),
            "-t",
            "-q",
            "-c",
            str(conf),
            "-p",
            f"{prefix}/",
            "-e",
            str(prefix / "err.log"),
            "-g",
            f"pid {prefix / 'nginx.pid'};",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_nginx_accepts_the_balancer_configuration(tmp_path: Path) -> None:
    result = nginx_test(NGINX_CONF, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_nginx_check_rejects_mistakes(tmp_path: Path) -> None:
    bad = tmp_path / "nginx.conf"
    bad.write_text(NGINX_CONF.read_text().replace("proxy_read_timeout", "proxy_reed_timeout"))
    result = nginx_test(bad, tmp_path)
    assert result.returncode != 0 and "proxy_reed_timeout" in result.stderr, result.stderr


def test_compose_puts_the_api_replicas_behind_the_balancer() -> None:
    """`--scale api=3` needs an api without a host port and container name; lb publishes the
    port, mounts docker/nginx.conf and proxies to the service name the replicas share."""
    services = compose()["services"]
    api, lb = services["api"], services["lb"]
    assert "ports" not in api and "container_name" not in api
    # published on loopback unless BIND_ADDR says otherwise
    assert lb["image"].startswith("nginx:") and lb["ports"] == ["${BIND_ADDR:-127.0.0.1}:8000:8000"]
    assert "./nginx.conf:/etc/nginx/nginx.conf:ro" in lb["volumes"]
    assert lb["depends_on"]["api"]["condition"] == "service_healthy"
    conf = NGINX_CONF.read_text()
    assert "set $api http://api:8000;" in conf and "proxy_pass $api;" in conf
    assert "resolver 127.0.0.11" in conf  # Docker's DNS: every replica's address, re-read
    # the api trusts X-Forwarded-For from the balancer's fixed address only (uvicorn's setting),
    # and nginx replaces whatever the client sent with the connection's own address
    lb_address = lb["networks"]["front"]["ipv4_address"]
    assert api["environment"]["FORWARDED_ALLOW_IPS"] == lb_address
    front = compose()["networks"]["front"]["ipam"]["config"][0]
    assert ipaddress.ip_address(lb_address) in ipaddress.ip_network(front["subnet"])
    assert ipaddress.ip_address(lb_address) not in ipaddress.ip_network(front["ip_range"])
    assert "proxy_set_header X-Forwarded-For $remote_addr;" in conf
    assert "$proxy_add_x_forwarded_for" not in conf
    # the api refuses to start without keys unless ALLOW_OPEN=1 (python -m app's check)
    assert api["environment"]["API_KEYS"] == "${API_KEYS:-}"
    assert api["environment"]["ALLOW_OPEN"] == "${ALLOW_OPEN:-0}"
    # replicas share the backends: the same Redis and database for api and worker
    for key in ("REDIS_URL", "DATABASE_URL"):
        assert api["environment"][key] == services["worker"]["environment"][key]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Replica(http.server.BaseHTTPRequestHandler):
    """A stand-in api replica: answers its own name and the forwarded-for header it got."""

    def do_GET(self) -> None:
        body = json.dumps(
            {"replica": self.server.name, "xff": self.headers.get("X-Forwarded-For")}  # type: ignore[attr-defined]
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_nginx_spreads_requests_over_replicas_and_skips_a_dead_one(tmp_path: Path) -> None:
    """The real configuration served by Debian's nginx, with Docker's DNS name `api` replaced
    by an upstream of three local replicas (the only change): every replica gets requests, a
    stopped one is skipped, the client address is forwarded and /lb/health answers."""
    servers = []
    for name in ("a", "b", "c"):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Replica)
        server.name = name  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    port = free_port()
    upstream = "".join(f"server 127.0.0.1:{s.server_address[1]};" for s in servers)
    temp = "".join(
        f"{kind}_temp_path {tmp_path / kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    conf = NGINX_CONF.read_text()
    for old, new in (
        ("http {", f"http {{ upstream api {{ {upstream} }} {temp}"),
        ("set $api http://api:8000;", "set $api http://api;"),
        ("listen 8000;", f"listen 127.0.0.1:{port};"),
        ("access_log /dev/stdout upstream;", f"access_log {tmp_path / 'access.log'} upstream;"),
    ):
        assert old in conf
        conf = conf.replace(old, new)
    (tmp_path / "nginx.conf").write_text(conf)
    command = [
        nginx(),
        "-c",
        str(tmp_path / "nginx.conf"),
        "-p",
        f"{tmp_path}/",
        "-e",
        str(tmp_path / "err.log"),
        "-g",
        f"pid {tmp_path / 'nginx.pid'}; daemon off;",
    ]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                urllib.request.urlopen(base + "/lb/health", timeout=1)
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                time.sleep(0.05)

        def hits(n: int) -> collections.Counter[str]:
            seen: collections.Counter[str] = collections.Counter()
            for k in range(n):
                forged = {"X-Forwarded-For": "6.6.6.6"} if k % 2 else {}  # replaced, not kept
                ask = urllib.request.Request(base + "/v2/health/live", headers=forged)
                with urllib.request.urlopen(ask, timeout=5) as answer:
                    got = json.loads(answer.read())
                assert got["xff"] == "127.0.0.1"
                seen[got["replica"]] += 1
            return seen

        assert set(hits(30)) == {"a", "b", "c"}
        servers[1].shutdown()
        servers[1].server_close()
        survivors = hits(30)  # a refused connection goes on to the next replica: no errors
        assert set(survivors) == {"a", "c"} and sum(survivors.values()) == 30
        with urllib.request.urlopen(base + "/lb/health", timeout=5) as answer:
            assert answer.read() == b"ok\n"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for server in servers:
            server.shutdown()
            server.server_close()


# --- the image, built and run here: buildah (vfs storage, chroot isolation), no Docker engine ---

IMAGE_TAG = "localhost/attribution-service:test"
README_ROW = [50, 1, 25, 90, 180, 100, 50, 4, 4.5, 90]  # the README's diabetes-mlp example
SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


def build_image_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_image", ROOT / "docker" / "build_image.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def image() -> Iterator[tuple[ModuleType, str]]:
    """Build the Dockerfile on a debootstrap base image (made once, kept) with this machine's pip
    set-up mounted read-only; the built image is removed afterwards (a few GB in vfs storage)."""
    if os.environ.get("BUILD_IMAGE_TEST") != "1":
        pytest.skip("opt-in, about 10 minutes: BUILD_IMAGE_TEST=1 builds and runs the image")
    missing = [t for t in ("buildah", "debootstrap") if not shutil.which(t, path=SBIN_PATH)]
    if missing:
        pytest.skip(f"{' and '.join(missing)} missing: apt-get install buildah debootstrap")
    if os.geteuid() != 0:
        pytest.skip("buildah with vfs storage and chroot isolation runs as root")
    builder = build_image_module()
    if not builder.image_exists(builder.BASE_TAG):
        print(f"base image in {builder.make_base():.0f} s")
    seconds = builder.build(IMAGE_TAG, builder.BASE_TAG, quiet=True)
    print(f"image built in {seconds:.0f} s, {builder.image_size(IMAGE_TAG) / 1e9:.2f} GB")
    yield builder, IMAGE_TAG
    subprocess.run([*builder.BUILDAH, "rmi", IMAGE_TAG], capture_output=True)


def in_image(image: tuple[ModuleType, str], code: str) -> str:
    builder, tag = image
    container, line = builder.run(tag, ["python", "-c", code])
    try:
        result = subprocess.run(line, capture_output=True, text=True, timeout=300)
    finally:
        builder.remove(container)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip()


@pytest.mark.slow
def test_image_has_the_cpu_torch_wheel_and_runs_unprivileged(image: tuple[ModuleType, str]) -> None:
    """torch came from the machine's wheel folder (the +cpu build), never from an index."""
    out = in_image(image, "import os, torch; print(torch.__version__, os.getuid())")
    assert out.split() == ["2.13.0+cpu", "10001"]
    builder, tag = image
    check = builder.buildah(
        "inspect", "--type", "image", "--format", "{{.Docker.Config.Healthcheck}}", tag
    )
    assert "/v2/health/live" in check  # kept: the image is written in docker format


@pytest.mark.slow
def test_image_serves_readiness_and_an_explanation(
    image: tuple[ModuleType, str], tmp_path: Path
) -> None:
    """The image's own command line (python -m app) started with `buildah run` (network host):
    ready on loopback, and the README's explanation equals the one this checkout computes."""
    builder, tag = image
    port = free_port()
    container, line = builder.run(
        tag,
        ["python", "-m", "app", "--host", "127.0.0.1", "--port", str(port), "--log-format", "text"],
        env={"LOAD_BACKGROUND_MODELS": "false"},
    )
    log = (tmp_path / "service.log").open("w")
    proc = subprocess.Popen(line, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600  # built-in models train at first start
        ready: dict[str, Any] = {}
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "service.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(base + "/v2/health/ready", timeout=5) as answer:
                    ready = json.loads(answer.read())
                    break
            except OSError:
                time.sleep(2)
        assert ready.get("ready") is True, (tmp_path / "service.log").read_text()[-3000:]
        request = urllib.request.Request(
            base + "/v2/models/diabetes-mlp/explain/shapley",
            data=json.dumps({"inputs": [README_ROW], "seed": 0}).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as answer:
            got = json.loads(answer.read())
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log.close()
        builder.remove(container)
    explanation = got["data"]["explanations"][0]
    assert got["meta"]["exact"] is True and explanation["exact"] is True
    values = np.array(explanation["values"])
    np.testing.assert_allclose(
        values.sum() + explanation["base_value"], explanation["instance_output_value"], rtol=1e-5
    )
    # the same model (trained deterministically in the image) and the same answer as here
    from fastapi.testclient import TestClient

    from app.main import create_app

    # Not make_client: the default settings, as the image runs them
    with TestClient(create_app(Settings(load_background_models=False))) as client:
        here = client.post(
            "/v2/models/diabetes-mlp/explain/shapley", json={"inputs": [README_ROW], "seed": 0}
        ).json()
    assert got["model_version"] == here["model_version"]
    np.testing.assert_allclose(values, here["data"]["explanations"][0]["values"], rtol=1e-5)
