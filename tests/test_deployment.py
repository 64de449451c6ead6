"""The shipped deployment's trust in client addresses, with real parts: `python -m app` (uvicorn
trusting only the balancer's address, as docker/compose.yaml sets FORWARDED_ALLOW_IPS) behind
Debian's nginx serving docker/nginx.conf; and the start refused without API_KEYS on a network
address. Loopback stands in for compose's networks: nginx connects from 127.0.0.3 (its
`front` address), clients from 127.0.0.5 and 127.0.0.6."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.__main__ import loopback, open_refusal
from tests.test_containers import NGINX_CONF, free_port, nginx

ROOT = Path(__file__).resolve().parents[1]
NGINX_ADDR, CLIENT_A, CLIENT_B = "127.0.0.3", "127.0.0.5", "127.0.0.6"


def get(port: int, path: str, source: str, headers: dict[str, str] | None = None) -> int:
    """Status of GET `path` on 127.0.0.1:`port`, the connection made from address `source`."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
    try:
        conn.request("GET", path, headers=headers or {})
        answer = conn.getresponse()
        answer.read()
        return answer.status
    finally:
        conn.close()


def wait_for(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    for _ in range(600):
        try:
            get(port, "/v2/health/live", "127.0.0.1")
            return
        except OSError:
            assert proc.poll() is None, f"{what} exited with {proc.returncode}"
            time.sleep(0.1)
    raise AssertionError(f"{what} did not answer")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int, Path]]:
    """(nginx port, service port, the service's log file)."""
    tmp = tmp_path_factory.mktemp("deployment")
    app_port, lb_port = free_port(), free_port()
    env = {
        **os.environ,
        "FORWARDED_ALLOW_IPS": NGINX_ADDR,  # as compose.yaml: the balancer's address only
        "RATE_LIMIT": "4/minute",
        "MODEL_DIR": str(tmp / "models"),
        "USER_MODEL_DIR": str(tmp / "user-models"),
        "LOAD_BACKGROUND_MODELS": "false",
        "MODEL_SANDBOX": "off",  # no user model here; the zygote is not needed
    }
    for name in ("REDIS_URL", "DATABASE_URL", "API_KEYS", "WEB_CONCURRENCY"):
        env.pop(name, None)
    log_path = tmp / "service.log"
    log = log_path.open("wb")
    service = subprocess.Popen(
        [sys.executable, "-m", "app", "--host", "127.0.0.1", "--port", str(app_port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    kinds = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    temp = "".join(f"{kind}_temp_path {tmp / kind};" for kind in kinds)
    conf = NGINX_CONF.read_text()
    for old, new in (  # Docker's DNS name and port: this machine's; nothing else changes
        ("http {", f"http {{ upstream api {{ server 127.0.0.1:{app_port}; }} {temp}"),
        ("set $api http://api:8000;", "set $api http://api;"),
        ("listen 8000;", f"listen 127.0.0.1:{lb_port};"),
        ("access_log /dev/stdout upstream;", f"access_log {tmp / 'access.log'} upstream;"),
        ("proxy_pass $api;", f"proxy_pass $api; proxy_bind {NGINX_ADDR};"),
    ):
        assert old in conf
        conf = conf.replace(old, new)
    (tmp / "nginx.conf").write_text(conf)
    balancer = subprocess.Popen(
        [
            nginx(),
            "-c",
            str(tmp / "nginx.conf"),
            "-p",
            f"{tmp}/",
            "-e",
            str(tmp / "err.log"),
            "-g",
            f"pid {tmp / 'nginx.pid'}; daemon off;",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(app_port, service, "python -m app")
        wait_for(lb_port, balancer, "nginx")
        yield lb_port, app_port, log_path
    finally:
        balancer.terminate()
        service.terminate()
        balancer.wait(timeout=30)
        service.wait(timeout=60)
        log.close()


def access_clients(log_path: Path, path: str) -> list[str]:
    """The `client` of every access log line for `path` so far."""
    found = []
    for line in log_path.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("path") == path and "client" in entry:
            found.append(entry["client"])
    return found


def test_a_forged_forwarded_for_changes_nothing_behind_nginx(
    stack: tuple[int, int, Path],
) -> None:
    """Through nginx the service sees each client's own address, whatever X-Forwarded-For the
    client sends: its rate limit counts per real client, and its access log names that client."""
    lb_port, _, log_path = stack
    statuses = [
        get(lb_port, "/v2/models", CLIENT_A, {"X-Forwarded-For": f"10.9.8.{k}"}) for k in range(6)
    ]
    assert statuses[:4] == [200] * 4 and statuses[4:] == [429, 429], statuses
    assert get(lb_port, "/v2/models", CLIENT_B) == 200  # another client keeps its own limit
    time.sleep(0.3)  # the access log line is written after the answer
    clients = access_clients(log_path, "/v2/models")
    assert clients.count(CLIENT_A) == 6 and clients.count(CLIENT_B) == 1, clients
    assert not any(c.startswith("10.9.8.") for c in clients)


def test_forwarded_for_from_anyone_but_nginx_is_ignored(stack: tuple[int, int, Path]) -> None:
    """Straight to the service (as a client inside the network would), the header is not
    trusted: the address is the connection's."""
    _, app_port, log_path = stack
    assert get(app_port, "/v2/health/ready", CLIENT_B, {"X-Forwarded-For": "6.6.6.6"}) in (
        200,
        503,
    )
    time.sleep(0.3)
    clients = access_clients(log_path, "/v2/health/ready")
    assert clients and clients[-1] == CLIENT_B and "6.6.6.6" not in clients


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("127.8.9.1", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.7", False),
        ("api.internal", False),
    ],
)
def test_loopback_addresses(host: str, expected: bool) -> None:
    assert loopback(host) is expected


def test_open_service_on_a_network_address_needs_allow_open() -> None:
    assert open_refusal("0.0.0.0", None, False) is not None
    assert open_refusal("0.0.0.0", "  ", False) is not None  # compose's ${API_KEYS:-} unset
    assert open_refusal("0.0.0.0", '[{"name": "a"}]', False) is None
    assert open_refusal("0.0.0.0", None, True) is None
    assert open_refusal("127.0.0.1", None, False) is None


def test_python_m_app_refuses_to_start_open_on_all_interfaces(tmp_path: Path) -> None:
    """The image's own command line without API_KEYS: exit status 2 and the reason, before the
    service starts; ALLOW_OPEN=1 starts it."""
    env = {k: v for k, v in os.environ.items() if k not in ("API_KEYS", "ALLOW_OPEN")}
    env |= {"MODEL_DIR": str(tmp_path / "m"), "USER_MODEL_DIR": str(tmp_path / "u")}
    port = free_port()
    command = [sys.executable, "-m", "app", "--host", "0.0.0.0", "--port", str(port)]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, timeout=120)
    assert done.returncode == 2
    said = done.stderr.decode()
    assert "API_KEYS is unset" in said and "ALLOW_OPEN=1" in said
    opened = subprocess.Popen(
        command,
        env=env | {"ALLOW_OPEN": "1", "LOAD_BACKGROUND_MODELS": "false", "MODEL_SANDBOX": "off"},
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(port, opened, "python -m app with ALLOW_OPEN=1")
    finally:
        opened.terminate()
        opened.wait(timeout=60)
