"""What a scan has already read or checked in a cache folder, recorded beside the entries.

Verifying a JAX entry means decompressing it (about half a millisecond with zstd), checking a
Triton group means reading its manifest, and a capped JAX entry's last use is in its ``-atime``
file: a scan of a million files cannot afford to redo that each time. Each kind's folder may
hold a record, ``.gpu-cache-verified``: 64-bit digests of what identifies a file's state (its
name, inode and size, and the times where they matter), each with a value (1 for "verified",
the ``-atime`` time in nanoseconds). A scan looks a file's digest up and reads or checks the
file only when it is missing; any change to the file (another inode, size or time) gives
another digest, so it is read again. Only verdicts that an entry is whole are recorded: a
broken one is checked again by every scan until prune removes it.

Writing the record is not a change to the cache (JAX, Triton and Inductor never look at it),
so dry runs and ``stats`` keep it up to date too. It is an optimisation only: a record that is
missing, unreadable, of another version or not a regular file counts as empty; one that
cannot be written is skipped. The cache is trusted (whoever can write it can run code in the
jobs), so a planted record can at worst hide a broken entry from a check, never do harm.
"""

from __future__ import annotations

import os
import sys
import zlib
from array import array
from itertools import chain

from gpu_cache.core import safe_io

NAME = ".gpu-cache-verified"
#: The record's first bytes; a record without them (an older gpu-cache's empty stamp) is empty.
MAGIC = b"gpu-cache verified v2\n"
#: A record larger than this is not read (a million entries take 16 MB).
MAX_BYTES = 1 << 30


_MASK = (1 << 64) - 1


def digest(*parts: int) -> int:
    """A 64-bit digest of whole numbers (a file's inode, size, times; :func:`text`). The same
    in every process: Python hashes numbers and tuples of them without a per-process seed
    (only text and bytes get one). Another Python version may hash differently: its
    digests then only miss, and the files are read again."""
    return hash(parts) & _MASK


def text(value: str) -> int:
    """A stable number for ``value`` (a name, a list of names), to put into :func:`digest`."""
    return zlib.crc32(value.encode("utf-8", "surrogateescape"))


class Record:
    """The record of one folder: look digests up with :meth:`get`, add with :meth:`put`,
    and :meth:`save` what this scan used or learned. A scan that verifies (prune, dry runs
    included) meets every digest still current, so the others are dropped; ``stats`` does not
    verify, so it keeps them (``complete=False``, which also spares it the bookkeeping)."""

    def __init__(self, folder: str | os.PathLike[str], known: dict[int, int] | None = None,
                 complete: bool = True) -> None:
        self.path = os.path.join(os.fspath(folder), NAME)
        self.known: dict[int, int] = known or {}
        self.kept: dict[int, int] = {}
        self.learned = 0
        #: The scan looks up every current digest (it verifies): :meth:`save` drops the rest.
        self.complete = complete

    @classmethod
    def load(cls, folder: str | os.PathLike[str], complete: bool = True) -> Record:
        """The record in ``folder``; an empty one when there is none (or none usable).
        ``complete``: see :meth:`save`."""
        record = cls(folder, complete=complete)
        try:
            data = safe_io.read_bounded(record.path, MAX_BYTES)
        except OSError:
            return record
        body = memoryview(data)[len(MAGIC):]
        if not data.startswith(MAGIC) or len(body) % 16:
            return record
        numbers = array("Q")
        numbers.frombytes(body)
        if sys.byteorder != "little":
            numbers.byteswap()
        record.known = dict(zip(numbers[0::2], numbers[1::2]))
        return record

    def get(self, key: int) -> int | None:
        """The value recorded for ``key`` (kept for the next :meth:`save`), or None."""
        value = self.known.get(key)
        if value is not None and self.complete:
            self.kept[key] = value
        return value

    def put(self, key: int, value: int) -> None:
        """Record ``value`` (0 to 2**64 - 1) for ``key``."""
        if self.known.get(key) != value:
            self.learned += 1
        self.kept[key] = value

    def changed(self) -> bool:
        """Whether :meth:`save` would write anything."""
        return self.learned > 0 or (self.complete and len(self.kept) != len(self.known))

    def save(self) -> bool:
        """Write the record when it changed, atomically (a name planted there is replaced,
        never written through); True when written. A ``complete`` scan looked every digest
        up that is still current (it verified), so those it did not meet are dropped;
        otherwise (``stats``) they are kept. Best effort: a folder that is gone or read-only
        keeps its old record.
        """
        if not self.changed() or not os.path.isdir(os.path.dirname(self.path)):
            return False
        if not self.complete:
            self.kept = self.known | self.kept
        numbers = array("Q", chain.from_iterable(self.kept.items()))
        if sys.byteorder != "little":
            numbers.byteswap()
        try:
            safe_io.replace_file(self.path, MAGIC + numbers.tobytes())
        except OSError:
            return False
        self.known, self.kept, self.learned = self.kept, dict(self.kept), 0
        return True
