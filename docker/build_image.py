"""Build and run the service's image without a Docker engine: Debian's debootstrap and buildah.

    python docker/build_image.py base    # local base image: Debian bookworm + Python 3.11 (debs)
    python docker/build_image.py build   # the Dockerfile on it, the machine's pip set-up mounted
    python docker/build_image.py run -- python -m app --host 127.0.0.1 --port 8000

buildah runs with the vfs storage driver and chroot isolation (no overlay, no user namespaces,
no daemon), network host. The build sees this machine's pip configuration the way
scripts/setup.sh does: `pip config list` (files and PIP_* variables) merged into one pip.conf
mounted at /etc/pip.conf, and every local path it names (wheel folder, file:// indexes, CA
bundle, constraints) mounted read-only at the same path. Nothing of it is copied into the image.
"""

from __future__ import annotations

import argparse
import configparser
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

ROOT = Path(__file__).resolve().parents[1]
BASE_TAG = "localhost/bookworm-python:3.11"
IMAGE_TAG = "localhost/attribution-service:buildah"
MIRROR = "http://deb.debian.org/debian"
# python3-venv: the Dockerfile's `python3 -m venv`; passwd (in minbase): useradd.
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
BUILDAH = ("buildah", "--storage-driver", "vfs")
ISOLATION = ("--isolation", "chroot")


def buildah(*args: str, capture: bool = True) -> str:
    result = subprocess.run(
        [*BUILDAH, *args], check=True, text=True, stdout=subprocess.PIPE if capture else None
    )
    return (result.stdout or "").strip()


def image_exists(tag: str) -> bool:
    probe = [*BUILDAH, "inspect", "--type", "image", tag]
    return subprocess.run(probe, capture_output=True).returncode == 0


def image_size(tag: str) -> int:
    """Bytes of the image's layers (uncompressed), as `buildah images` counts them."""
    rows = json.loads(buildah("images", "--json", tag))
    number, unit = str(rows[0]["size"]).split()  # "3.22 GB": decimal units, as docker prints
    return round(float(number) * 1000 ** (["B", "kB", "MB", "GB", "TB"].index(unit)))


def make_base(tag: str = BASE_TAG, mirror: str = MIRROR) -> float:
    """debootstrap a minimal bookworm with Python 3.11 and commit it as `tag`; seconds taken."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                "--include=" + ",".join(BASE_PACKAGES),
                "bookworm",
                str(rootfs),
                mirror,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        # what slim images drop too: downloaded .debs and package lists
        for folder in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for item in (rootfs / folder).glob("*"):
                if item.is_file():
                    item.unlink()
        container = buildah("from", "scratch")
        try:
            mount = buildah("mount", container)
            subprocess.run(["cp", "-a", f"{rootfs}/.", mount], check=True)
            buildah("umount", container)
            buildah(
                "config",
                "--env",
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--env",
                "LANG=C.UTF-8",
                "--cmd",
                "python3",
                container,
            )
            buildah("commit", "--quiet", container, tag)
        finally:
            subprocess.run([*BUILDAH, "rm", container], capture_output=True)
    return time.monotonic() - start


def local_paths(value: str) -> list[Path]:
    """The existing local files and folders a pip option value names (paths or file:// URLs)."""
    found = []
    for token in value.split():
        path = unquote(urlparse(token).path).rstrip("/") if token.startswith("file://") else token
        if path.startswith("/") and Path(path).exists():
            # a PEP 503 folder index (.../simple) links to its files beside it (../../files)
            found.append(Path(path).parent if Path(path).name == "simple" else Path(path))
    return found


def pip_config(python: str = sys.executable) -> tuple[str, list[Path]]:
    """This machine's effective pip configuration as one pip.conf, and the local paths it uses."""
    listing = subprocess.run(
        [python, "-m", "pip", "config", "list"], check=True, capture_output=True, text=True
    ).stdout
    files: dict[str, dict[str, str]] = {}
    env: dict[str, str] = {}
    for line in listing.splitlines():
        name, sep, quoted = line.partition("=")
        if not sep:
            continue
        section, _, key = name.rpartition(".")
        value = quoted.strip().strip("'\"")
        if section == ":env:":
            env[key] = value  # PIP_* variables: they win over every file, in every command
        else:
            files.setdefault(section, {})[key] = value
    for options in files.values():
        for key in env:
            options.pop(key, None)
    files.setdefault("global", {}).update(env)
    parser = configparser.ConfigParser(interpolation=None)
    for section, options in files.items():
        parser[section] = options
    lines = []
    for section in parser.sections():
        lines.append(f"[{section}]")
        lines.extend(f"{key} = {value}" for key, value in parser[section].items())
    paths: list[Path] = []
    for options in files.values():
        for value in options.values():
            paths.extend(p for p in local_paths(value) if p not in paths)
    # a path inside another mounted folder comes with it
    paths = [p for p in paths if not any(q != p and q in p.parents for q in paths)]
    return "\n".join(lines) + "\n", paths


def build(
    tag: str = IMAGE_TAG, base: str = BASE_TAG, python: str = sys.executable, quiet: bool = False
) -> float:
    """Build the Dockerfile on `base` with the machine's pip set-up mounted; seconds taken."""
    conf, paths = pip_config(python)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pipconf-") as tmp:
        conf_file = Path(tmp) / "pip.conf"
        conf_file.write_text(conf)
        conf_file.chmod(0o644)
        Path(tmp).chmod(0o755)
        volumes = [f"{conf_file}:/etc/pip.conf:ro"] + [f"{p}:{p}:ro" for p in paths]
        # docker format: OCI image configs have no HEALTHCHECK (buildah would drop it)
        args = ["build", *ISOLATION, "--format", "docker", "--network", "host", "--pull=never"]
        args.append("--layers=false")
        args += ["--build-arg", f"BASE_IMAGE={base}", "-f", str(ROOT / "Dockerfile"), "-t", tag]
        for volume in volumes:
            args += ["--volume", volume]
        if quiet:
            args.append("--quiet")
        buildah(*args, str(ROOT), capture=False)
    return time.monotonic() - start


def run(tag: str, command: list[str], env: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """A working container of `tag` and the `buildah run` command line that runs `command`."""
    container = buildah("from", "--pull=never", "--quiet", tag)
    line = [*BUILDAH, "run", *ISOLATION, "--network", "host"]
    for key, value in (env or {}).items():
        line += ["--env", f"{key}={value}"]
    return container, [*line, container, "--", *command]


def remove(container: str) -> None:
    subprocess.run([*BUILDAH, "rm", container], capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python docker/build_image.py", description=__doc__)
    parser.add_argument("step", choices=["base", "build", "run", "pip-config"])
    parser.add_argument("--base-image", default=BASE_TAG)
    parser.add_argument("--tag", default=IMAGE_TAG)
    parser.add_argument("command", nargs="*", help="run: the command (after --)")
    args = parser.parse_args()
    if shutil.which("buildah") is None and args.step != "pip-config":
        sys.exit("buildah is not installed (apt-get install buildah debootstrap)")
    if args.step == "base":
        print(f"base image {args.base_image} in {make_base(args.base_image):.0f} s")
    elif args.step == "build":
        if not image_exists(args.base_image) and args.base_image == BASE_TAG:
            print(f"base image {args.base_image} in {make_base(args.base_image):.0f} s")
        seconds = build(args.tag, args.base_image)
        size = image_size(args.tag)
        print(f"image {args.tag}: built in {seconds:.0f} s, {size / 1e9:.2f} GB")
    elif args.step == "pip-config":
        conf, paths = pip_config()
        print(conf + "mounted read-only: " + " ".join(map(str, paths)))
    else:
        container, line = run(args.tag, args.command or ["python", "-m", "app", "--help"])
        try:
            sys.exit(subprocess.run(line).returncode)
        finally:
            remove(container)


if __name__ == "__main__":
    main()
