"""What pack and unpack share: progress lines and the flags of the files they make."""

from __future__ import annotations

import logging
import os
import time

from gpu_cache.config.units import format_size

log = logging.getLogger("gpu_cache.carry")

#: A new file, never one that is there (nor written through a link planted at its name).
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
#: A real folder, never a link to one.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
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
