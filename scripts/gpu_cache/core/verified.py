"""What a scan has already read or checked in a cache folder, recorded beside the entries.

Verifying a JAX entry means decompressing it (about a tenth of a millisecond with zstd),
checking a Triton group means reading its manifest, and a capped JAX entry's last use is in its
``-atime`` file: a scan of a million files cannot afford to redo that each time. Each kind's
folder may hold a record, ``.gpu-cache-verified``: 64-bit digests of what identifies a file's
state, each with a value. A scan looks a file's digest up and reads or checks the file only
when it is missing, so a digest must change whenever the verdict could:

* a JAX ``-cache`` file: its key, inode (number and generation) and size, as any sealed file's
  (:func:`gpu_cache.core.kinds.integrity.seal_of`, which also keeps the generation under the
  file's change time; JAX writes an entry once and never rewrites it; the startup hook moves its
  mtime on every hit, so times would re-verify every used entry). The value is the CRC-32 of its
  bytes when it was verified. Damage that keeps the
  size (bit rot, a storage fault, a write in place with the old mtime put back) leaves the
  digest as it was, so each verifying scan also reads some of these entries again and
  compares the CRC (:meth:`Record.rechecks`: in digest order from where the last scan
  stopped, for a tenth of the scan's own time, so every entry in turn while prune stays
  within its bound); ``doctor --fix`` (``recheck_all``) verifies every entry again. An entry
  whose bytes changed is recorded as :data:`DAMAGED` until prune removes it.
* a JAX ``-atime`` file (inode, size, mtime, ctime: JAX rewrites it on each use): its time;
* a Triton group manifest, an Inductor kernel library: name, inode, size and mtime; 1.

Only verdicts that an entry is whole, or that a whole one changed, are recorded: a broken one
is checked again by every scan until prune removes it.

Writing the record is not a change to the cache (JAX, Triton and Inductor never look at it),
so dry runs and ``stats`` keep it up to date too. It is an optimisation only: a record that is
missing, unreadable, of another version or not a regular file counts as empty; one that
cannot be written is skipped. The cache is trusted (whoever can write it can run code in the
jobs), so a record the cache's owners wrote can at worst hide a broken entry from a check.
One that another user may have written (:func:`gpu_cache.core.owners.written_by_others`, the
rule an entry of the folder is read by) counts as empty: a leftover record of another account
that called 20 whole entries damaged made prune remove all 20 (the startup hook's seal reader
ignores such a record too).
"""

from __future__ import annotations

import os
import sys
import time
import zlib
from array import array
from collections.abc import Iterator
from itertools import chain
from typing import Any

from gpu_cache._hook.gpu_cache_hook.seals import MAGIC, MAX_BYTES, NAME
from gpu_cache.core import owners, safe_io

# The record's name, its first bytes (a record without them, an older gpu-cache's empty stamp,
# is empty) and the size past which it is not read (a million entries take 16 MB) are the
# startup hook's seal reader's, which looks a seal up without reading the whole record (version 4
# keeps its digests in order); version 3 (unordered) is read too.
_UNORDERED = b"gpu-cache verified v3\n"
#: A verifying scan spends at most this share of its own time reading entries recorded whole
#: again (JAX: one read each), and reads at least RECHECK_AT_LEAST of them whatever it takes.
RECHECK_SHARE = 0.1
RECHECK_AT_LEAST = 64
#: The value of an entry whose bytes changed after it was verified (above any CRC-32).
DAMAGED = 1 << 32


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
    verify, so it keeps them (``complete=False``, which also spares it the bookkeeping).
    ``recheck_all``: :meth:`get` knows nothing, so that everything is verified again
    (:meth:`previous` still tells what was recorded)."""

    def __init__(self, folder: str | os.PathLike[str], known: dict[int, int] | None = None,
                 complete: bool = True, recheck_all: bool = False) -> None:
        self.path = os.path.join(os.fspath(folder), NAME)
        self.known: dict[int, int] = known or {}
        self.kept: dict[int, int] = {}
        self.learned = 0
        #: The scan looks up every current digest (it verifies): :meth:`save` drops the rest.
        self.complete = complete
        self.recheck_all = recheck_all
        #: The digest where :meth:`rechecks` starts: the one after the last read again.
        self.cursor = 0
        self._moved = False
        self._candidates: dict[int, Any] = {}  # by distance from the cursor: sorts fast

    @classmethod
    def load(cls, folder: str | os.PathLike[str], complete: bool = True,
             recheck_all: bool = False) -> Record:
        """The record in ``folder``; an empty one when there is none (or none usable).
        ``complete``, ``recheck_all``: see the class."""
        record = cls(folder, complete=complete, recheck_all=recheck_all)
        try:  # read by the rule its folder's entries are read by (kinds' _judge)
            data = owners.read_trusted(record.path, MAX_BYTES, owners.team_of(os.stat(folder)))
        except OSError:  # none, unreadable, or another user's (owners.Untrusted)
            return record
        body = memoryview(data)[len(MAGIC):]
        if not data.startswith((MAGIC, _UNORDERED)) or len(body) % 16 != 8:
            return record
        numbers = array("Q")
        numbers.frombytes(body)
        if sys.byteorder != "little":
            numbers.byteswap()
        record.cursor = numbers[0]
        record.known = dict(zip(numbers[1::2], numbers[2::2]))
        return record

    def get(self, key: int) -> int | None:
        """The value recorded for ``key`` (kept for the next :meth:`save`), or None."""
        if self.recheck_all:
            return None
        value = self.known.get(key)
        if value is not None and self.complete:
            self.kept[key] = value
        return value

    def previous(self, key: int) -> int | None:
        """The value recorded for ``key`` before this scan, even with ``recheck_all``."""
        return self.known.get(key)

    def current(self, key: int) -> int | None:
        """The value of ``key`` as this scan left it, or as recorded before it."""
        value = self.kept.get(key)
        return self.known.get(key) if value is None else value

    def drop(self, key: int) -> None:
        """Forget ``key`` (the file it judged is being removed): no later :meth:`save` keeps it."""
        kept, known = self.kept.pop(key, None), self.known.pop(key, None)
        if kept is not None or known is not None:
            self.learned += 1

    def candidate(self, key: int, item: Any) -> None:
        """Offer the entry of ``key``, recorded whole, to :meth:`rechecks` (``item``: what
        the scan needs to read it again)."""
        self._candidates[(key - self.cursor) & _MASK] = item

    def rechecks(self, spent: float) -> Iterator[Any]:
        """The items of the :meth:`candidate` entries that this scan reads again, while the
        caller reads each: in digest order from :attr:`cursor` on, for
        :data:`RECHECK_SHARE` of ``spent`` (the scan's own seconds so far) and at least
        :data:`RECHECK_AT_LEAST` of them. The next :meth:`save` keeps where they stopped, so
        every entry is read again in turn (a scan that does not verify reads none)."""
        deadline = time.monotonic() + RECHECK_SHARE * spent
        candidates, self._candidates = self._candidates, {}
        if not self.complete:
            return
        cursor = self.cursor
        for count, distance in enumerate(sorted(candidates)):
            if count >= RECHECK_AT_LEAST and time.monotonic() >= deadline:
                return
            self.cursor, self._moved = (cursor + distance + 1) & _MASK, True
            yield candidates[distance]

    def put(self, key: int, value: int) -> None:
        """Record ``value`` (0 to 2**64 - 1) for ``key``."""
        if self.known.get(key) != value:
            self.learned += 1
        self.kept[key] = value

    def changed(self) -> bool:
        """Whether :meth:`save` would write anything."""
        return self.learned > 0 or self._moved \
            or (self.complete and len(self.kept) != len(self.known))

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
        kept = self.kept
        pairs = chain.from_iterable((key, kept[key]) for key in sorted(kept))  # in order: the hook bisects
        numbers = array("Q", chain((self.cursor,), pairs))
        if sys.byteorder != "little":
            numbers.byteswap()
        try:
            safe_io.replace_file(self.path, MAGIC + numbers.tobytes())
        except OSError:
            return False
        self.known, self.kept, self.learned, self._moved = self.kept, dict(self.kept), 0, False
        return True
