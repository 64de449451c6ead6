"""Progress records of a trainer (Salvage, Naouar et al. ICLR 2025; AutoGnothi, Wang et al.
ICLR 2025): each record is timed, kept, and handed to the caller, who may stop the training."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

Progress = Callable[[dict[str, Any]], bool]  # a progress record -> keep going?


class Recorder:
    """Calling it with a record stamps the seconds since the start, keeps the record in
    `history`, passes it to `progress` and answers whether to keep going."""

    def __init__(self, progress: Progress | None) -> None:
        self.start = time.perf_counter()
        self.history: list[dict[str, Any]] = []
        self.progress = progress

    def __call__(self, record: dict[str, Any]) -> bool:
        record["seconds"] = self.seconds()
        self.history.append(record)
        return self.progress is None or self.progress(record)

    def seconds(self) -> float:
        """Seconds since the start, to the millisecond."""
        return round(time.perf_counter() - self.start, 3)


__all__ = ["Progress", "Recorder"]
