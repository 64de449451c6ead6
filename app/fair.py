"""Compute slots shared fairly between keys (issue 39).

EXPLAIN_WORKERS slots, handed out on the event loop and shared between the keys active now:
each holds at most its share of them, and a free slot goes to the waiting key served longest
ago (round robin), not to the oldest request. A key with 60 explanations queued holds one of two
slots while another key is active, so that key's small request finds the other slot free
instead of waiting behind 60 (or behind the two running). A lone key uses every slot.

A key is an API key's name, or the client's address when the service runs open (`identity`, as
the rate limit's). Each key may have at most MAX_PENDING_PER_KEY explanations queued or running
(app/pool.py `share`); beyond it that key gets 429 with Retry-After while the others go on (the
total bound, MAX_PENDING_EXPLAINS, still answers 503).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque

from starlette.requests import Request

from app.ratelimit import scope_identity


def identity(request: Request) -> str:
    """Whose work this is: the rate limit's identity (`key:<name>`, or `addr:<client>` open)."""
    return scope_identity(request.scope)


ACTIVE_S = 2.0  # a key that asked for a slot this recently counts as active


class FairSlots:
    """`slots` compute slots shared between the active keys (module docstring): a key holds at
    most its share, ceil(slots / active keys), a key being active while it has work waiting or
    running or asked within ACTIVE_S; a free slot goes to the waiting key under its share that
    was served longest ago. A lone key uses every slot; with two active keys and two slots each
    runs one, so one key's flood never holds the slot another key's request needs."""

    def __init__(self, slots: int, active_s: float = ACTIVE_S) -> None:
        self.slots = slots
        self.busy = 0
        self.active_s = active_s
        self.running: dict[str, int] = {}
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()
        self._served: dict[str, int] = {}  # key -> the grant count when it was last served
        self._seen: dict[str, float] = {}  # key -> when it last asked (loop time)
        self._grants = 0
        self._timer: asyncio.TimerHandle | None = None

    def share(self, now: float | None = None) -> int:
        """The most slots one key may hold now."""
        now = asyncio.get_running_loop().time() if now is None else now
        active = {k for k, t in self._seen.items() if now - t < self.active_s}
        active |= set(self.running) | set(self._waiting)
        return max(1, -(-self.slots // max(1, len(active))))

    async def acquire(self, who: str) -> None:
        """Return holding a slot; cancelled while waiting, nothing is held."""
        loop = asyncio.get_running_loop()
        self._seen[who] = loop.time()
        if len(self._seen) > 4096:  # forget keys idle long ago
            cut = loop.time() - 10 * self.active_s
            self._seen = {k: t for k, t in self._seen.items() if t > cut}
        if self.busy < self.slots and self.running.get(who, 0) < self.share():
            self._take(who)
            return
        future: asyncio.Future[None] = loop.create_future()
        self._waiting.setdefault(who, deque()).append(future)
        try:
            await future
        except BaseException:
            if future.done() and not future.cancelled():  # granted as it was cancelled
                self.release(who)
            else:
                queue = self._waiting.get(who)
                if queue is not None and future in queue:
                    queue.remove(future)
                    if not queue:
                        del self._waiting[who]
            raise

    def _take(self, who: str) -> None:
        self.busy += 1
        self.running[who] = self.running.get(who, 0) + 1
        self._grants += 1
        self._served[who] = self._grants
        if len(self._served) > 4096:  # forget the keys served longest ago
            for old in sorted(self._served, key=self._served.__getitem__)[:1024]:
                del self._served[old]

    def release(self, who: str) -> None:
        """Give `who`'s slot back; free slots go to waiting keys (`_grant`)."""
        self.busy -= 1
        left = self.running.get(who, 1) - 1
        if left > 0:
            self.running[who] = left
        else:
            self.running.pop(who, None)
        self._grant()

    def _grant(self) -> None:
        """Hand free slots to the waiting keys under their share, served longest ago first. A
        slot left free while a key over its share waits is looked at again when the quiet keys
        stop counting as active."""
        self._timer = None
        share = self.share()
        while self.busy < self.slots and self._waiting:
            under = [k for k in self._waiting if self.running.get(k, 0) < share]
            if not under:
                if self._timer is None:
                    self._timer = asyncio.get_running_loop().call_later(self.active_s, self._grant)
                return
            who = min(under, key=lambda k: self._served.get(k, 0))
            queue = self._waiting[who]
            future = queue.popleft()
            if not queue:
                del self._waiting[who]
            if not future.done():
                self._take(who)
                future.set_result(None)
