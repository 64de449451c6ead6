"""Service settings from the environment (pydantic-settings); defaults are embedded."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def _cache_root() -> Path:
    return Path.home() / ".cache" / "attribution-service"


def _default_model_dir() -> Path:
    return _cache_root() / "models"


def _default_database_url() -> str:
    _cache_root().mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{_cache_root() / 'jobs.db'}"


class Settings(BaseSettings):
    """Every knob of the service; environment variables override (e.g. REDIS_URL)."""

    model_config = SettingsConfigDict(env_prefix="", extra="ignore")

    redis_url: str | None = Field(None, description="Redis for the cache; in-process LRU if unset")
    model_dir: Path = Field(default_factory=_default_model_dir)
    load_models_on_start: bool = True
    load_background_models: bool = Field(
        True,
        description="also preload the background built-ins (the language models, ~1.6 GB) at "
        "start; false: they load on first use",
    )
    cache_ttl_s: int = 7 * 24 * 3600
    cache_max_entries: int = 2048
    cache_timeout_s: float = 0.5
    cache_local_entries: int = Field(
        0,
        ge=0,
        description="recent Redis hits each API process keeps in memory and answers from, also "
        "while Redis is down (answers never change for a key); 0: every hit asks Redis",
    )
    cache_local_ttl_s: float = Field(
        60.0, gt=0, description="how long a process serves a Redis hit from its own memory"
    )
    max_body_bytes: int = 16 * 1024 * 1024
    max_upload_bytes: int = Field(
        4 * 1024**3,
        ge=1,
        description="an audit's uploaded instances (POST /v2/jobs/upload: JSON lines, CSV or "
        "Parquet), spooled to disk and read a chunk at a time",
    )
    max_instances: int = 1000
    max_background_rows: int = 1000
    max_budget: int = 1 << 24  # model rows per instance
    max_batch_bytes: int = Field(
        256 << 20,
        ge=1 << 20,
        description="working memory of one model call (bytes): rows per call = this / the bytes "
        "one row takes, measured when the model is loaded (gradient explainers: with its "
        "backward pass); a row that cannot fit is refused (400). On CUDA the device's share is "
        "half its free memory and this bounds the rows built in host memory",
    )
    explain_workers: int = 2  # concurrent explanations being computed
    io_workers: int = 32  # concurrent validations and cache look-ups
    torch_threads: int = 1
    device: str = Field(
        "auto",
        description="where torch models, language models and gradient explainers compute: "
        "auto (the first CUDA device if torch sees one, else the CPU), cpu, cuda or cuda:<k>; "
        "an explicit CUDA device this machine lacks stops the start",
    )
    max_pending_explains: int = Field(
        64, ge=1, description="explanations queued or running; beyond: 503 with Retry-After"
    )
    max_pending_per_key: int = Field(
        0,
        ge=0,
        description="explanations one key (or client address, open) may have queued or "
        "running; beyond: 429 with Retry-After for that key alone; 0: half of "
        "MAX_PENDING_EXPLAINS",
    )
    header_timeout_s: float = Field(
        5.0,
        ge=0,
        description="a connection whose request headers are not complete this long after it "
        "opened (or after its last answer) is closed; 0: no limit",
    )
    max_connections_per_client: int = Field(
        256,
        ge=0,
        description="open connections per client address and API process; beyond, new ones "
        "are closed at once; 0: no cap (behind a proxy, every client is the proxy's address)",
    )
    read_workers: int = Field(
        8,
        ge=1,
        description="threads for reads (model metadata, infer, examples, model loading), apart "
        "from the explanations' slots: a read never waits behind an explanation",
    )
    default_timeout_ms: int = Field(
        60_000,
        ge=0,
        description="time limit of a synchronous explain request without timeout_ms, from its "
        "arrival: the sampled estimators then answer their anytime estimate (meta.partial), the "
        "others 504; 0: no default limit. Jobs are not bounded by it",
    )
    shutdown_grace_s: float = Field(
        10.0,
        ge=0,
        description="on SIGTERM, how long running requests may finish before they are "
        "cancelled and the process exits",
    )
    rate_limit: str | None = Field(
        None,
        description='per API key (or client address when open), e.g. "50/second; 2000/minute"; '
        "unset: no limit. Shared through Redis when REDIS_URL is set",
    )
    database_url: str = Field(
        default_factory=_default_database_url, description="jobs and results (SQLAlchemy URL)"
    )
    job_queue: Literal["auto", "inprocess", "celery"] = Field(
        "auto", description="auto: Celery workers when REDIS_URL is set, else in-process"
    )
    job_workers: int = Field(2, ge=0, description="in-process job threads; 0: store jobs, run none")
    job_chunk_size: int = Field(
        0,
        ge=0,
        description="instances per queued task of an audit (a task claims, leases and stores "
        "its own); 0: an eighth of the job, within 50 to 1,000 (several tasks for the workers "
        "to share, few enough that queueing costs little)",
    )
    job_visibility_timeout_s: int = 300  # a killed worker's chunk is redelivered after this
    max_job_instances: int = 1_000_000
    api_keys: str | None = Field(
        None, description='JSON list of {"name", "sha256", "scopes"}; unset: open (local use)'
    )
    allow_open: bool = Field(
        False,
        description="python -m app: serve without API_KEYS on an address other than loopback "
        "(an open service on a network); unset, such a start is refused",
    )
    user_model_dir: Path = Field(default_factory=lambda: _cache_root() / "user-models")
    max_model_bytes: int = 64 * 1024 * 1024
    model_repository: Path | None = Field(
        None,
        description="a server-side folder of Hugging Face checkpoints that registrations may name "
        "by `uri` (models beyond the upload size); unset: `uri` is refused",
    )
    # Tenancy (issue 27): whose cached answers a request may be served.
    cache_scope: Literal["shared", "key"] = Field(
        "shared",
        description="shared: one explanation cache for every API key (a hit shows that some "
        "key asked the same before); key: each key's answers are its own",
    )
    # No lost jobs (issue 27): chunk leases, attempts and the sweeper (app/jobs/leases.py).
    job_lease_s: float = Field(
        30,
        gt=0,
        description="a running chunk's lease, renewed every third of it; a chunk "
        "whose lease lapses (its worker died) is queued again by the sweeper",
    )
    job_max_attempts: int = Field(
        3,
        ge=1,
        description="attempts of a chunk that fail (an error, or its worker died) "
        "before the job fails with the last error",
    )
    job_sweep_interval_s: float = Field(
        10, gt=0, description="how often workers look for chunks that no worker holds"
    )
    job_store_retry_s: float = Field(
        60,
        ge=0,
        description="how long a chunk retries writing its results while the job "
        "database is unavailable before it is put back in the queue",
    )

    # Remote models (issue 27): allowed hosts, total time per request, cache lifetime.
    remote_model_hosts: str = Field(
        "",
        description="comma-separated hosts remote models may reach (host, host:port, "
        "*.domain, an IP network 10.0.0.0/8); empty: only globally routable addresses "
        "(loopback, link-local, private ranges refused)",
    )
    remote_call_timeout_s: float = Field(
        30.0, gt=0, description="total time of one request to a remote model, first byte to last"
    )
    remote_cache_ttl_s: float = Field(
        300.0, ge=0, description="how long a remote model's cached answers are served; 0: never"
    )
    remote_version_check_s: float = Field(
        30.0, ge=0, description="how often a remote model's metadata (its version) is re-read"
    )
    # Model workers (issue 27): user model files load and run in sandboxed processes.
    model_sandbox: Literal["on", "off"] = Field(
        "on",
        description="on: TorchScript, ONNX, XGBoost and LightGBM uploads load, are checked and "
        "run in model worker processes (no network, empty root, rlimits, user nobody); off: in "
        "the server process (debugging only)",
    )
    trusted_model_code: bool = Field(
        False,
        description="with MODEL_SANDBOX=off only: true lets TorchScript files load in the "
        "server process (their code runs there); false refuses them (400)",
    )
    model_worker_memory_mb: int = Field(
        4096, ge=0, description="address space of one model worker (RLIMIT_AS, MiB); 0: none"
    )
    model_workers_memory_mb: int = Field(
        0,
        ge=0,
        description="memory for every model worker together (MiB): at most this over "
        "MODEL_WORKER_MEMORY_MB workers are alive at once, the idle one used longest ago "
        "stopped first to start another; 0: no cap",
    )
    model_worker_call_timeout_s: float = Field(
        120.0, gt=0, description="longest model call (and load) in a worker; past it: killed, 502"
    )
    model_worker_processes: int = Field(
        2,
        ge=1,
        le=16,
        description="worker processes per registered model (calls at once); the second starts "
        "only when two calls overlap (an audit's two job threads, concurrent requests)",
    )

    @field_validator("device")
    @classmethod
    def _device_exists(cls, value: str) -> str:
        """auto | cpu | cuda | cuda:k, and a CUDA device must exist (checked at start)."""
        from models.device import DeviceError, resolve_device  # torch: only when set

        try:
            resolve_device(value)
        except DeviceError as exc:
            raise ValueError(str(exc)) from None
        return value.strip().lower()

    @field_validator("remote_model_hosts")
    @classmethod
    def _hosts_parse(cls, value: str) -> str:
        """REMOTE_MODEL_HOSTS must parse (checked at start, not at the first registration)."""
        from models.adapters.remote_http import HostPolicy

        HostPolicy(value)
        return value
