"""What pack and unpack share: their logger and progress lines."""

from __future__ import annotations

import logging
import time

from gpu_cache.config.units import format_size

log = logging.getLogger("gpu_cache.carry")

_PROGRESS_SECONDS = 5.0


class Progress:
    """A log line every few seconds while a long loop runs."""

    def __init__(self, what: str, total: int) -> None:
        self.what, self.total = what, total
        self.next = time.monotonic() + _PROGRESS_SECONDS

    def step(self, done: int, size: int) -> None:
        if time.monotonic() >= self.next:
            log.info("%s: %d/%d entries, %s", self.what, done, self.total, format_size(size))
            self.next = time.monotonic() + _PROGRESS_SECONDS
