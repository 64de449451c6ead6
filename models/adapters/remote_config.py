"""The settings of remote models (REMOTE_* in app/settings.py) and their stored credentials.

`configure` sets what models built from then on use (the app does, from its Settings); until
then the REMOTE_* environment variables apply. Credentials are sealed with a random salt into
the declaration's `remote_auth` (the stored meta), so that the model version, a hash of the
declaration, says nothing of them.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass

from models.adapters.remote_http import HostPolicy


@dataclass(frozen=True)
class RemoteConfig:
    """The settings of remote models (app/settings.py's REMOTE_* fields)."""

    hosts: str = ""  # REMOTE_MODEL_HOSTS
    call_timeout_s: float = 30.0  # REMOTE_CALL_TIMEOUT_S: total, per request
    cache_ttl_s: float = 300.0  # REMOTE_CACHE_TTL_S
    version_check_s: float = 30.0  # REMOTE_VERSION_CHECK_S: metadata re-read at most this often


_configured: RemoteConfig | None = None


def _env_config() -> RemoteConfig:
    env = os.environ
    base = RemoteConfig()
    return RemoteConfig(
        hosts=env.get("REMOTE_MODEL_HOSTS", base.hosts),
        call_timeout_s=float(env.get("REMOTE_CALL_TIMEOUT_S", base.call_timeout_s)),
        cache_ttl_s=float(env.get("REMOTE_CACHE_TTL_S", base.cache_ttl_s)),
        version_check_s=float(env.get("REMOTE_VERSION_CHECK_S", base.version_check_s)),
    )


def config() -> RemoteConfig:
    """The configured settings (`configure`), else the REMOTE_* environment variables."""
    return _configured or _env_config()


def configure(cfg: RemoteConfig | None) -> RemoteConfig | None:
    """Set the settings remote models built from now on use (None: the environment's);
    returns the previous ones."""
    global _configured
    if cfg is not None:
        HostPolicy(cfg.hosts)  # a malformed list is an error now, not at the first call
    previous, _configured = _configured, cfg
    return previous


# --- credentials stored apart ---------------------------------------------------------------


def seal_headers(headers: dict[str, str]) -> str | None:
    """The stored form of a model's secret headers (JSON; a random salt, so that the model
    version, a hash of the declaration, says nothing of them); None when there are none."""
    if not headers:
        return None
    return json.dumps({"salt": secrets.token_hex(16), "headers": headers}, sort_keys=True)


def open_headers(sealed: str | None) -> dict[str, str]:
    """The headers `seal_headers` stored ({} for None or a malformed value)."""
    if not sealed:
        return {}
    try:
        headers = json.loads(sealed).get("headers") or {}
    except (ValueError, AttributeError):
        return {}
    return {str(k): str(v) for k, v in headers.items()} if isinstance(headers, dict) else {}
