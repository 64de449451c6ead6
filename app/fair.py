"""Compute slots shared fairly between keys (issue 39).

EXPLAIN_WORKERS slots, handed out on the event loop: a free slot goes to the key with work
waiting that was served longest ago (round robin), not to the oldest request, so a key with 60
explanations queued delays another key's one request by at most the explanations running, not
60. A key is an API key's name, or the client's address when the service runs open
(`identity`, as the rate limit's). Each key may have at most MAX_PENDING_PER_KEY explanations
queued or running (`share`); beyond it that key gets 429 with Retry-After while the others go
on (the total bound, MAX_PENDING_EXPLAINS, still answers 503).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from typing import Any

from starlette.requests import Request


def identity(request: Request | Any) -> str:
    """Whose work this is: `key:<name>` with API keys, else `addr:<client address>`."""
    key = getattr(getattr(request, "state", None), "api_key", None)
    if key is None:
        key = request.scope.get("state", {}).get("api_key") if hasattr(request, "scope") else None
    if key is not None:
        return f"key:{key.name}"
    client = getattr(request, "client", None)
    return f"addr:{client.host if client else 'unknown'}"


class FairSlots:
    """`slots` compute slots; `acquire(who)` waits its key's turn (module docstring)."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.busy = 0
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()
        self._served: dict[str, int] = {}  # key -> the grant count when it was last served
        self._grants = 0

    def waiting(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    async def acquire(self, who: str) -> None:
        """Return holding a slot; cancelled while waiting, nothing is held."""
        if self.busy < self.slots and not self._waiting:
            self.busy += 1
            self._serve(who)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(who, deque()).append(future)
        try:
            await future
        except BaseException:
            if future.done() and not future.cancelled():  # granted as it was cancelled
                self.release()
            else:
                queue = self._waiting.get(who)
                if queue is not None and future in queue:
                    queue.remove(future)
                    if not queue:
                        del self._waiting[who]
            raise

    def _serve(self, who: str) -> None:
        self._grants += 1
        self._served[who] = self._grants
        if len(self._served) > 4096:  # forget the keys served longest ago
            for old in sorted(self._served, key=self._served.__getitem__)[:1024]:
                del self._served[old]

    def release(self) -> None:
        """Give a slot back: to the waiting key served longest ago (a key never served first,
        then in arrival order), else free it."""
        while self._waiting:
            who = min(self._waiting, key=lambda k: self._served.get(k, 0))
            queue = self._waiting[who]
            future = queue.popleft()
            if not queue:
                del self._waiting[who]
            if not future.done():
                self._serve(who)
                future.set_result(None)  # the slot passes on: `busy` stays
                return
        self.busy -= 1
