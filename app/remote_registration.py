"""Registration of remote OIP models: the URL without credentials, the credentials (userinfo
or a `remote_headers` form field) sealed apart for the declaration's `remote_auth` (stored
meta, never in an answer), and the host checked against REMOTE_MODEL_HOSTS."""

from __future__ import annotations

import json
import re
from urllib.parse import urlsplit

import httpcore

from app.errors import InvalidInput
from app.settings import Settings
from models.adapters.remote import RemoteConfig, configure, seal_headers
from models.adapters.remote_http import HostPolicy, HostRefused, split_credentials

HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")
RESERVED = {"host", "content-length", "content-type", "transfer-encoding", "connection"}
MAX_HEADERS = 16
MAX_HEADER_CHARS = 4096


def remote_config(settings: Settings) -> RemoteConfig:
    """The REMOTE_* settings as models/adapters/remote.py reads them."""
    return RemoteConfig(
        hosts=settings.remote_model_hosts,
        call_timeout_s=settings.remote_call_timeout_s,
        cache_ttl_s=settings.remote_cache_ttl_s,
        version_check_s=settings.remote_version_check_s,
    )


def _headers(raw: str | None) -> dict[str, str]:
    """The `remote_headers` form field: a JSON object of header names to values."""
    if raw is None:
        return {}
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        raise InvalidInput(
            "remote_headers must be a JSON object of header names to values"
        ) from None
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise InvalidInput("remote_headers must be a JSON object of header names to values")
    if len(value) > MAX_HEADERS:
        raise InvalidInput(f"remote_headers: at most {MAX_HEADERS} headers")
    for name, text in value.items():
        if not HEADER_NAME.match(name) or name.lower() in RESERVED:
            raise InvalidInput(f"remote_headers: {name[:64]!r} is not a header that may be set")
        if len(text) > MAX_HEADER_CHARS or not text.isprintable() or not text.isascii():
            raise InvalidInput(
                f"remote_headers: the value of {name!r} must be printable ASCII, at most "
                f"{MAX_HEADER_CHARS} characters"
            )
    return dict(value)


def prepare_remote(url: str, raw_headers: str | None, settings: Settings) -> tuple[str, str | None]:
    """(the URL to store, without userinfo; the sealed credentials or None). A URL that is
    not http(s), or whose host REMOTE_MODEL_HOSTS does not allow, is a 400. Blocking (DNS)."""
    configure(remote_config(settings))  # the app's settings for the models built from now on
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (a malformed port raises here)
    except ValueError:
        raise InvalidInput("remote_url is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput("remote_url must be an http(s) URL of an OIP model")
    clean, found = split_credentials(url)
    headers = {**found, **_headers(raw_headers)}
    try:
        HostPolicy(settings.remote_model_hosts).check_url(clean)
    except HostRefused as exc:
        raise InvalidInput(f"remote_url: {exc}", code="remote_host_refused") from None
    except httpcore.ConnectError as exc:
        raise InvalidInput(f"remote_url: {exc}", code="invalid_model") from None
    return clean, seal_headers(headers)
