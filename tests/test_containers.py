"""Container files, checked without a Docker engine: hadolint on the Dockerfile, the compose
file against the Compose Specification's JSON schema (check-jsonschema's vendored copy), and the
facts the issue asks for (multi-stage, non-root, health checks, the README's requirement file,
only settings the service knows)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

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
    known = {name.upper() for name in Settings.model_fields}
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
