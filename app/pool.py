"""The explanation compute pool: EXPLAIN_WORKERS slots, each held until its thread has really
stopped, handed out fairly between keys (app/fair.py).

A route that stops waiting (its deadline, a client gone, a shutdown) answers at once, but a
Python thread cannot be killed: it stops at its next deadline check (explainers call
check_deadline between model calls). Until then it keeps its slot of the app's limiter and
its place among the MAX_PENDING_EXPLAINS, so abandoned work can never compute beside
EXPLAIN_WORKERS new ones (anyio's `abandon_on_cancel` alone hands the slot back at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
from prometheus_client import CollectorRegistry, Gauge

from app.fair import FairSlots

T = TypeVar("T")


class ComputePool:
    """Runs explanations on the app's slots (`state.limiter`, a FairSlots of EXPLAIN_WORKERS)
    and counts them in `state.pending_explains` (queued, running, and abandoned but running),
    and per key (`by_key`)."""

    def __init__(self, state: Any, registry: CollectorRegistry) -> None:
        self.state = state
        self.by_key: dict[str, int] = {}  # queued or running, per key (app/fair.py identity)
        self._lock = threading.Lock()
        self.threads = 0  # threads inside a computation now
        self.peak = 0  # the most at once since the start
        self.abandoned = 0  # of them, those whose route stopped waiting
        self._live = Gauge(
            "explain_compute_threads",
            "Threads computing an explanation now (never more than EXPLAIN_WORKERS per process)",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self._peak = Gauge(
            "explain_compute_threads_peak",
            "The most threads computing explanations at once in a process since its start",
            registry=registry,
            multiprocess_mode="max",
        )
        self._abandoned = Gauge(
            "explain_abandoned_running",
            "Computations whose request was already answered (deadline, client gone) that "
            "still run until their next deadline check; each holds its compute slot",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self._pending = Gauge(
            "explain_pending",
            "Explanations queued or running, abandoned ones included (MAX_PENDING_EXPLAINS)",
            registry=registry,
            multiprocess_mode="livesum",
        )

    def full(self) -> bool:
        """Whether MAX_PENDING_EXPLAINS are queued or running already."""
        return int(self.state.pending_explains) >= int(self.state.settings.max_pending_explains)

    def share(self) -> int:
        """The most explanations one key may have queued or running (MAX_PENDING_PER_KEY;
        0: half of MAX_PENDING_EXPLAINS)."""
        settings = self.state.settings
        total = int(settings.max_pending_explains)
        return int(getattr(settings, "max_pending_per_key", 0) or 0) or max(1, total // 2)

    def full_for(self, who: str) -> bool:
        """Whether `who` has its share queued or running already."""
        return self.by_key.get(who, 0) >= self.share()

    def _count(self, delta: int, who: str = "") -> None:
        """Change the pending counts (on the event loop's thread only)."""
        self.state.pending_explains += delta
        self._pending.set(self.state.pending_explains)
        left = self.by_key.get(who, 0) + delta
        if left > 0:
            self.by_key[who] = left
        else:
            self.by_key.pop(who, None)

    async def run(self, fn: Callable[..., T], *args: Any, who: str = "") -> T:
        """fn(*args) in a thread that holds one compute slot from start to end, given in
        `who`'s turn (app/fair.py). Cancelled while queued: nothing ran and nothing is held.
        Cancelled while running: the thread is abandoned (the caller's cancel check makes it
        stop at its next deadline check) and gives its slot back only when it returns."""
        slots: FairSlots = self.state.limiter
        loop = asyncio.get_running_loop()
        claim = {"started": False, "finished": False, "dropped": False, "abandoned": False}
        self._count(1, who)
        try:
            await slots.acquire(who)
        except BaseException:
            self._count(-1, who)
            raise

        def release() -> None:  # on the loop's thread
            slots.release(who)
            self._count(-1, who)

        def work() -> T:
            with self._lock:
                if claim["dropped"]:  # the caller gave up before the thread began
                    raise anyio.get_cancelled_exc_class()()
                claim["started"] = True
                self.threads += 1
                self.peak = max(self.peak, self.threads)
                self._live.set(self.threads)
                self._peak.set(self.peak)
            try:
                return fn(*args)
            finally:
                with self._lock:
                    claim["finished"] = True
                    self.threads -= 1
                    self._live.set(self.threads)
                    if claim["abandoned"]:
                        self.abandoned -= 1
                        self._abandoned.set(self.abandoned)
                # A closed loop (RuntimeError): the app, and its limiter, are gone already.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(release)

        try:
            # One thread per call (its own limiter): the compute slot above is the bound.
            return await anyio.to_thread.run_sync(
                work, abandon_on_cancel=True, limiter=anyio.CapacityLimiter(1)
            )
        except BaseException:
            with self._lock:
                if not claim["started"]:
                    claim["dropped"] = True
                elif not claim["finished"]:
                    claim["abandoned"] = True  # running on; the slot goes back when it returns
                    self.abandoned += 1
                    self._abandoned.set(self.abandoned)
            if claim["dropped"]:
                release()
            raise
