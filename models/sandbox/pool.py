"""Model worker processes: started from a clean zygote, one group per model version, restarted
after a crash, killed when they overrun a call, stopped with their model or the server.

Workers come from multiprocessing's forkserver: a process started fresh (never forked from the
server, so it holds none of its memory, connections or secrets) that imported torch, the booster
libraries and onnxruntime once; each worker is a fork of it (tens of milliseconds, no imports).
A group keeps `processes` workers of one model version (MODEL_WORKER_PROCESSES), each serving
one call at a time. Crashes (EOF, an exit code or a signal), a call past its deadline (the
watchdog kills the worker) and an exhausted memory limit are `ModelWorkerError`s; the worker
starts again on the next call, after a backoff once it failed twice in a row.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from models.base import ModelError, RowTooLargeError
from models.declaration import InvalidModelError
from models.sandbox import protocol, worker

log = logging.getLogger(__name__)


class ModelWorkerError(ModelError):
    """A model's worker process crashed, overran its deadline or exhausted its memory."""

    status = 502
    code = "model_worker_failed"


class ModelWorkerRestarting(ModelWorkerError):
    """The model's worker failed repeatedly and waits out its backoff before it starts again:
    come back after `retry_after_s`."""

    status = 503
    code = "model_worker_restarting"

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class SandboxConfig:
    """MODEL_SANDBOX and the MODEL_WORKER_* settings."""

    enabled: bool = True
    memory_mb: int = 4096  # address space of a worker (the zygote's imports take ~1.5 GiB)
    call_timeout_s: float = 120.0
    build_timeout_s: float = 120.0
    processes: int = 1  # workers per model
    threads: int = 1  # torch threads in a worker
    nproc: int = 4096  # processes and threads of uid nobody (all workers together)
    idle_s: float = 600.0  # an unused worker stops after this; the next call starts it again
    skip_file_checks: bool = False  # tests of the sandbox only: the upload checks let all in
    trusted_code: bool = False  # TRUSTED_MODEL_CODE: with the sandbox off, TorchScript may load
    max_workers: int = 0  # workers alive at once, all models (MODEL_WORKERS_MEMORY_MB); 0: any


_config = SandboxConfig()
_start_lock = threading.Lock()
_groups: weakref.WeakSet[WorkerGroup] = weakref.WeakSet()
_context: Any = None


def configure(config: SandboxConfig) -> None:
    """Use `config` for workers started from now on."""
    global _config
    _config = config


def current_config() -> SandboxConfig:
    return _config


def _signal_name(code: int | None) -> str:
    if code is None:
        return "no exit code"
    if code < 0:
        with contextlib.suppress(ValueError):
            return signal.Signals(-code).name
        return f"signal {-code}"
    return f"exit code {code}"


# What the zygote's environment keeps of the server's: names a library reads at import (locale,
# threads, caches), never one that looks like a secret (a token, key, password, URL).
ZYGOTE_ENV = frozenset(
    {"PATH", "LANG", "LANGUAGE", "TZ", "TMPDIR", "HOME", "LD_LIBRARY_PATH", "PYTHONHASHSEED",
     "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "XDG_CACHE_HOME"}
)  # fmt: skip
ZYGOTE_ENV_PREFIXES = ("LC_", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "HF_", "TRANSFORMERS_")
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "URL", "CREDENTIAL", "AUTH")


def zygote_environment(env: dict[str, str]) -> dict[str, str]:
    """The part of `env` the workers' zygote starts with (ZYGOTE_ENV, ZYGOTE_ENV_PREFIXES; no
    name holding SECRET_WORDS): API_KEYS, DATABASE_URL, REDIS_URL and the rest stay out."""
    return {
        k: v
        for k, v in env.items()
        if (k in ZYGOTE_ENV or k.startswith(ZYGOTE_ENV_PREFIXES))
        and not any(word in k.upper() for word in SECRET_WORDS)
    }


def _clean_spawn(original: Callable[..., Any]) -> Callable[..., Any]:
    """multiprocessing's helper-process spawner (the forkserver's, the resource tracker's), run
    through `env -i` with `zygote_environment`: the new interpreter never holds the server's
    environment, so neither does a byte of any worker's memory (a worker forks from it; Python
    copies the environment into its heap at start, where clearing it later leaves the bytes)."""

    def spawn(path: str | bytes, args: Sequence[str], passfds: Sequence[int]) -> int:
        env = [f"{k}={v}" for k, v in zygote_environment(dict(os.environ)).items()]
        command = ["env", "-i", *env, os.fsdecode(path), *args[1:]]
        return int(original(os.fsencode(ENV_BIN), command, passfds))

    spawn.clean = True  # type: ignore[attr-defined]
    return spawn


ENV_BIN = "/usr/bin/env"


def _ctx() -> Any:
    """The forkserver context, its zygote preloading the libraries (spawn where there is none),
    started from a clean environment (`_clean_spawn`)."""
    global _context
    if _context is None:
        ctx: Any
        try:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(list(worker.PRELOAD))
        except ValueError:
            ctx = multiprocessing.get_context("spawn")
        from multiprocessing import util

        if os.path.exists(ENV_BIN) and not getattr(util.spawnv_passfds, "clean", False):
            util.spawnv_passfds = _clean_spawn(util.spawnv_passfds)
        _context = ctx
    return _context


@contextlib.contextmanager
def _without_main() -> Iterator[None]:
    """Workers do not import the server's __main__ (pytest's, uvicorn's): its path is left out
    of the preparation data a started process receives."""
    from multiprocessing import spawn

    original = spawn.get_preparation_data

    def prepared(name: str) -> dict[str, Any]:
        data = original(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data

    spawn.get_preparation_data = prepared
    try:
        yield
    finally:
        spawn.get_preparation_data = original


class _Watchdog:
    """One thread that kills workers past their call's deadline."""

    def __init__(self) -> None:
        self._deadlines: dict[int, tuple[float, Worker]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def arm(self, w: Worker, seconds: float, sweep_only: bool = False) -> None:
        """Kill `w` in `seconds` unless disarmed; `sweep_only`: just start the thread (it
        also stops idle workers)."""
        with self._lock:
            if not sweep_only:
                self._deadlines[id(w)] = (time.monotonic() + seconds, w)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="model-watchdog")
                self._thread.daemon = True
                self._thread.start()

    def disarm(self, w: Worker) -> None:
        with self._lock:
            self._deadlines.pop(id(w), None)

    def _run(self) -> None:
        swept = time.monotonic()
        while True:
            time.sleep(0.1)
            now = time.monotonic()
            if now - swept > 5.0:
                swept = now
                for group in list(_groups):
                    group.stop_idle(now)
            with self._lock:
                late = [w for t, w in self._deadlines.values() if t <= now]
                for w in late:
                    self._deadlines.pop(id(w), None)
            for w in late:
                w.timed_out = True
                w.kill()


_watchdog = _Watchdog()


class Worker:
    """One worker process and its end of the pipe."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.process: Any = None
        self.conn: Connection | None = None
        self.timed_out = False
        self.used = time.monotonic()
        self.folder: str | None = None  # a checkpoint unpacked for this worker's build

    def drop_folder(self) -> None:
        """Remove the checkpoint folder (after the build: the worker holds what it read)."""
        if self.folder is not None:
            import shutil

            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def start(
        self, config: SandboxConfig, prepared: tuple[str, str, list[str]] | None = None
    ) -> None:
        """Start the process; `prepared`: (a folder to remove, the checkpoint folder in it
        that becomes the worker's root, the modules to import before the chroot)."""
        ctx = _ctx()
        parent, child = ctx.Pipe(duplex=True)
        root, imports = (None, ()) if prepared is None else (prepared[1], tuple(prepared[2]))
        self.folder = None if prepared is None else prepared[0]
        process = ctx.Process(
            target=worker.main,
            args=(child, config.memory_mb, config.threads, config.nproc, root, imports),
            name=f"model-worker:{self.name}",
            daemon=True,
        )
        with _start_lock, _without_main():
            process.start()
        child.close()
        self.process, self.conn, self.timed_out = process, parent, False
        _watchdog.arm(self, 0.0, sweep_only=True)

    def call(
        self,
        header: dict[str, Any],
        arrays: Sequence[np.ndarray],
        timeout_s: float,
        max_bytes: int,
        expected: Sequence[tuple[int, ...] | None] | None = None,
    ) -> tuple[dict[str, Any], list[np.ndarray]]:
        """One request and its reply. Raises _Died (with why) when the worker is gone."""
        assert self.conn is not None
        _watchdog.arm(self, timeout_s)
        try:
            protocol.send(self.conn, header, arrays)
            reply, out = protocol.recv(self.conn, max_bytes, None)
        except (EOFError, OSError, BrokenPipeError) as exc:
            raise _Died(self._why(exc)) from None
        except protocol.ProtocolError as exc:
            if self.process is not None:  # a reset read from a worker that died: its death
                self.process.join(0.5)
                if self.process.exitcode is not None:
                    raise _Died(self._why(exc)) from None
            self.kill()
            raise _Died(f"broke the protocol ({exc})") from None
        finally:
            _watchdog.disarm(self)
            self.used = time.monotonic()
        if not reply.get("ok"):
            if reply.get("kind") == "memory":
                self.kill()
            raise _Failed(str(reply.get("kind", "model_error")), str(reply.get("error", ""))[:1000])
        if expected is not None:
            if len(out) != len(expected):
                self.kill()
                raise _Died(f"broke the protocol ({len(out)} arrays, {len(expected)} expected)")
            for i, (a, want) in enumerate(zip(out, expected, strict=True)):
                if want is not None and tuple(a.shape) != tuple(want):
                    self.kill()
                    raise _Died(
                        f"broke the protocol (array {i}: shape {list(a.shape)}, "
                        f"expected {list(want)})"
                    )
        return reply, out

    def _why(self, exc: BaseException) -> str:
        if self.process is not None:
            self.process.join(2.0)
            if self.process.exitcode is None:
                self.kill()
        if self.timed_out:
            return "timeout"
        code = None if self.process is None else self.process.exitcode
        if code is not None and code >= 0:  # it exited itself (e.g. a message it refused)
            return f"exited ({_signal_name(code)})"
        return f"crashed ({_signal_name(code)})"

    def kill(self) -> None:
        process = self.process
        if process is not None and process.is_alive():
            with contextlib.suppress(Exception):
                process.kill()
            with contextlib.suppress(Exception):
                process.join(5.0)

    def close(self) -> None:
        self.kill()
        self.drop_folder()
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
        if self.process is not None:
            with contextlib.suppress(Exception):
                self.process.close()
        self.process = self.conn = None


_room_lock = threading.Lock()


def live_workers() -> int:
    """Model worker processes alive now, every model's."""
    return sum(1 for g in list(_groups) for w in list(g._all) if w.alive)


def make_room(config: SandboxConfig, starting: Worker) -> None:
    """Before `starting` starts: while config.max_workers are alive, stop the idle worker used
    longest ago, of any model (its group starts it again when next needed); 503 with
    Retry-After when every one is in a call."""
    if config.max_workers <= 0:
        return
    with _room_lock:
        while live_workers() >= config.max_workers:
            idle = []
            for g in list(_groups):
                with g._lock:
                    idle += [(w.used, id(w), g, w) for w in g._idle if w.alive and w != starting]
            if not idle:
                raise ModelWorkerRestarting(
                    f"{config.max_workers} model workers are running (MODEL_WORKERS_MEMORY_MB / "
                    "MODEL_WORKER_MEMORY_MB) and every one is computing; retry soon",
                    1.0,
                )
            _, _, group, victim = min(idle, key=lambda t: (t[0], t[1]))
            with group._lock:
                if victim not in group._idle:  # taken for a call meanwhile: look again
                    continue
                group._idle.remove(victim)
            victim.close()  # dead in its group: restarted by its next call
            log.info("model worker of %s stopped to make room (at most %d alive)",
                     group.name, config.max_workers)  # fmt: skip
            with group._lock:
                group._idle.append(victim)


class _Died(Exception):
    """The worker process is gone (crashed, killed by the watchdog, broke the protocol)."""


class _Failed(Exception):
    """The worker answered with an error: (kind, message)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def _library_error(kind: str, message: str) -> ModelError:
    from models.adapters.trees import BoosterError

    if kind == "invalid_model":
        return InvalidModelError(message)
    if kind == "booster":
        return BoosterError(message)
    if kind == "row_too_large":
        return RowTooLargeError(message)
    return ModelError(message)


class WorkerGroup:
    """The workers of one model version: built from its declaration and file."""

    def __init__(
        self, meta: dict[str, Any], data: bytes, max_batch_bytes: int, config: SandboxConfig
    ) -> None:
        self.name = str(meta["name"])
        self.meta = meta
        self.data = data
        self.max_batch_bytes = max_batch_bytes
        self.config = config
        self.sandbox: dict[str, str] = {}
        self._idle: list[Worker] = []
        self._all: list[Worker] = []
        self._slots = threading.BoundedSemaphore(max(1, config.processes))
        self._lock = threading.Lock()
        self._failures = 0
        self._failed_at = 0.0
        self.files = meta.get("format") == "huggingface"  # a checkpoint folder, not one file
        self.folder_bytes = 0
        weakref.finalize(self, _close_all, self._all)
        _groups.add(self)

    def _build_header(self, check: bool, probe: bool, spec: bool) -> dict[str, Any]:
        return {
            "op": "build",
            "meta": self.meta,
            "max_batch_bytes": self.max_batch_bytes,
            "check": check,
            "probe": probe,
            "spec": spec,
            "skip_file_checks": self.config.skip_file_checks,
        }

    def _payload(self) -> list[np.ndarray]:
        if self.files:  # the worker reads the unpacked folder
            return []
        return [np.frombuffer(self.data, dtype=np.uint8)]

    def _start(self, w: Worker) -> None:
        """Start `w` once there is room (`make_room`); a checkpoint is unpacked for it first
        (models/sandbox/hf_worker.py)."""
        make_room(self.config, w)
        if not self.files:
            w.start(self.config)
            return
        import os

        from models.sandbox.hf_worker import imports_for, prepare_folder

        parent, root = prepare_folder(self.meta, self.data)
        self.folder_bytes = sum(
            os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(root) for n in names
        )
        try:
            w.start(self.config, (parent, root, imports_for(root)))
        except BaseException:
            import shutil

            shutil.rmtree(parent, ignore_errors=True)
            raise

    def build(self, check: bool) -> tuple[dict[str, Any], list[np.ndarray]]:
        """Start the first worker and build the model in it: its spec and weights. `check`
        (registration): the loader's checks and test passes; a crash or a memory limit hit
        there is an InvalidModelError naming it."""
        w = Worker(self.name)
        fmt = self.meta.get("format", "model")
        state_bytes = len(self.data) + (1 << 20)  # weights cannot exceed their file
        try:
            self._start(w)
            reply, arrays = w.call(
                self._build_header(check, probe=True, spec=True),
                self._payload(),
                self.config.build_timeout_s,
                state_bytes,
            )
        except _Died as exc:
            w.close()
            why = str(exc)
            if why == "timeout":
                why = f"took longer than {self.config.build_timeout_s:g} s"
            raise InvalidModelError(
                f"the {fmt} file {why} in its loader or test pass (model worker); it is refused"
            ) from None
        except _Failed as exc:
            w.close()
            if exc.kind == "memory":
                raise InvalidModelError(
                    f"the {fmt} file needs more memory than a model worker has "
                    f"(MODEL_WORKER_MEMORY_MB={self.config.memory_mb}) to load and check: "
                    f"{exc.message}"
                ) from None
            raise _library_error(exc.kind, exc.message) from None
        finally:
            w.drop_folder()
        if sum(a.nbytes for a in arrays) > state_bytes:
            w.close()
            raise InvalidModelError(f"the {fmt} model's weights exceed its file's size")
        self.sandbox = {str(k): str(v)[:200] for k, v in dict(reply.get("sandbox", {})).items()}
        with self._lock:
            self._all.append(w)
            self._idle.append(w)
        return reply, arrays

    def facts(self) -> dict[str, Any]:
        """What the file states, read in a worker of its own (stopped afterwards)."""
        w = Worker(self.name)
        fmt = self.meta.get("format", "model")
        try:
            w.start(self.config)
            reply, _ = w.call(
                {"op": "facts", "format": fmt, "skip_file_checks": self.config.skip_file_checks},
                self._payload(),
                self.config.build_timeout_s,
                1,
            )
        except _Died as exc:
            raise InvalidModelError(
                f"the {fmt} file {exc} in its reader (model worker); it is refused"
            ) from None
        except _Failed as exc:
            raise _library_error(exc.kind, exc.message) from None
        finally:
            w.close()
        facts = reply.get("facts")
        return facts if isinstance(facts, dict) else {}

    def _restart(self, w: Worker) -> None:
        with self._lock:
            failures, failed_at = self._failures, self._failed_at
        if failures >= 2:
            wait = min(30.0, 2.0 ** (failures - 2)) - (time.monotonic() - failed_at)
            if wait > 0:
                raise ModelWorkerRestarting(
                    f"model {self.name}'s worker failed {failures} times in a row; it restarts "
                    f"in {wait:.1f} s",
                    wait,
                )
        w.close()
        try:
            self._start(w)
            w.call(
                self._build_header(False, probe=False, spec=False),
                self._payload(),
                self.config.build_timeout_s,
                1 << 20,
            )
        except ModelWorkerRestarting:  # no room (make_room): not the worker's failure
            w.close()
            raise
        except (_Died, _Failed, ModelError, OSError) as exc:
            w.close()
            self._failed()
            raise ModelWorkerError(
                f"model {self.name}'s worker could not start again ({exc}); it is tried again "
                "on the next request"
            ) from None
        finally:
            w.drop_folder()

    def _failed(self) -> None:
        with self._lock:
            self._failures += 1
            self._failed_at = time.monotonic()

    def call(
        self,
        header: dict[str, Any],
        arrays: Sequence[np.ndarray],
        max_bytes: int,
        expected: Sequence[tuple[int, ...] | None] | None = None,
        what: str = "computing",
    ) -> tuple[dict[str, Any], list[np.ndarray]]:
        """One call on a free worker of the group (started again if it died)."""
        config = self.config
        header = {**header, "cpu_s": int(config.call_timeout_s * max(1, config.threads)) + 5}
        with self._slots:
            with self._lock:
                w = self._idle.pop() if self._idle else None
                if w is None:
                    w = Worker(self.name)
                    self._all.append(w)
            try:
                if not w.alive:
                    self._restart(w)
                try:
                    reply, out = w.call(header, arrays, config.call_timeout_s, max_bytes, expected)
                except _Died as exc:
                    self._failed()
                    why = str(exc)
                    if why == "timeout":
                        why = (
                            f"took longer than {config.call_timeout_s:g} s "
                            "(MODEL_WORKER_CALL_TIMEOUT_S) and was stopped"
                        )
                    raise ModelWorkerError(
                        f"model {self.name}'s worker {why} while {what}; it restarts on the "
                        "next request"
                    ) from None
                except _Failed as exc:
                    if exc.kind == "memory":
                        self._failed()
                        raise ModelWorkerError(
                            f"model {self.name}'s worker ran out of memory "
                            f"(MODEL_WORKER_MEMORY_MB={config.memory_mb}) while {what}; it "
                            "restarts on the next request"
                        ) from None
                    raise _library_error(exc.kind, exc.message) from None
                with self._lock:
                    self._failures = 0
                return reply, out
            finally:
                with self._lock:
                    self._idle.append(w)

    def stop_idle(self, now: float) -> None:
        """Stop the workers unused for `idle_s` (not those computing)."""
        with self._lock:
            idle = [w for w in self._idle if w.alive and now - w.used > self.config.idle_s]
            self._idle = [w for w in self._idle if w not in idle]
        for w in idle:
            w.kill()
        with self._lock:
            self._idle += idle

    def pids(self) -> list[int]:
        """Process ids of the live workers (tests, diagnostics)."""
        with self._lock:
            return [w.process.pid for w in self._all if w.alive]

    def close(self) -> None:
        _close_all(self._all)


def _close_all(workers: list[Worker]) -> None:
    for w in list(workers):
        w.close()


@atexit.register
def shutdown() -> None:
    """Stop every worker (at server exit; the zygote exits with the server)."""
    for group in list(_groups):
        group.close()
