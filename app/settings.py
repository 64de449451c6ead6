"""Service settings from the environment (pydantic-settings); defaults are embedded."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_model_dir() -> Path:
    return Path.home() / ".cache" / "attribution-service" / "models"


class Settings(BaseSettings):
    """Every knob of the service; environment variables override (e.g. REDIS_URL)."""

    model_config = SettingsConfigDict(env_prefix="", extra="ignore")

    redis_url: str | None = Field(None, description="Redis for the cache; in-process LRU if unset")
    model_dir: Path = Field(default_factory=_default_model_dir)
    load_models_on_start: bool = True
    cache_ttl_s: int = 7 * 24 * 3600
    cache_max_entries: int = 2048
    cache_timeout_s: float = 0.5
    max_body_bytes: int = 16 * 1024 * 1024
    max_instances: int = 1000
    max_background_rows: int = 1000
    max_budget: int = 1 << 24  # model rows per instance
    explain_workers: int = 2
    torch_threads: int = 1
