"""What carrying an entry to another machine asks of a kind (``gpu-cache pack``/``unpack``,
``publish``/``fetch``: :mod:`gpu_cache.carry`, docs/kinds.md): the entries pack takes
(:class:`Carried`), an entry as an archive's manifest names it (:class:`ManifestEntry`), and the
writer that puts one in place whole on unpack (:class:`Writer`). ``carry/`` is generic; each
carried kind's own part is ``<kind>_carry.py`` beside it, which builds on this module.

Every name here comes from an archive, which is untrusted: :func:`shown` escapes it for a
message, and a writer checks what it wrote before it puts it in place (:class:`Damaged`).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_cache.core import safe_io

if TYPE_CHECKING:
    from gpu_cache.core.kinds.kind import Kind


class Refused(Exception):
    """Unpack will not write this archive here (a mismatch, an unsafe member, no room): one
    line for the user, exit code 1. Nothing has been written, unless ``written`` (the archive
    changed between the check and the writes: the entries written until then are whole)."""

    def __init__(self, reason: str, hint: str = "", written: bool = False) -> None:
        super().__init__(reason)
        self.reason, self.hint, self.written = reason, hint, written

    def __str__(self) -> str:
        outcome = "stopped; the entries written until then are whole" if self.written \
            else "refused, nothing written"
        return f"{self.reason}; {outcome}" + (f" ({self.hint})" if self.hint else "")


class Damaged(Exception):
    """An entry whose files are not what the archive's manifest says (damaged in transit or
    on disk): it is not written, and the entry already there is kept."""


def shown(name: str) -> str:
    """A name from an archive as a message shows it: escaped, and cut when long."""
    text = ascii(name)
    return text if len(text) <= 120 else text[:117] + "...'"


def file_name(name: str) -> bool:
    """Whether ``name`` is text a file name can hold (not a lone surrogate, no NUL, at most
    255 bytes)."""
    try:
        size = len(os.fsencode(name))
    except UnicodeEncodeError:
        return False
    return 0 < size <= 255 and "\x00" not in name


def plain_name(name: str) -> bool:
    """A single, visible path component that a file of an entry may have: no ``/``, not
    ``.``, ``..`` or hidden (a writer's temporary file)."""
    return file_name(name) and "/" not in name and not name.startswith(".")


def regular_files(folder: Path) -> dict[str, Path]:
    """The regular files directly in ``folder`` with plain names (a writer's temporary folder
    or file is not part of the entry)."""
    out = {}
    with os.scandir(folder) as listing:
        for item in listing:
            if item.is_file(follow_symlinks=False) and plain_name(item.name):
                out[item.name] = Path(item.path)
    return out


@dataclass
class Carried:
    """One entry as pack would take it: its files (name -> path), its computation's ``name``,
    what the manifest says of it beyond that (``fields``: the kind's :attr:`Kind.carry_fields`),
    or why it is left out (``problem``: broken)."""

    key: str
    name: str | None
    files: dict[str, Path]
    last_use: float
    problem: str | None = None
    fields: dict[str, str | None] = field(default_factory=dict)


@dataclass
class ManifestEntry:
    """One entry of an archive as its manifest names it: ``files``: file name -> bytes;
    ``sha256``: file name -> its SHA-256; ``name``: the computation, kernel or device kind;
    ``last_use``: seconds since the epoch; ``fields``: the kind's own (its
    :attr:`Kind.carry_fields`: Triton's ``kind`` and ``target``, an autotuning result's
    ``tokamax`` and ``jax`` versions); ``warm``: its bytes are what a warm process compiled, as
    the packed root's outputs references named them (docs/outputs.md)."""

    kind: Kind
    key: str
    files: dict[str, int]
    sha256: dict[str, str]
    last_use: float = 0.0
    name: str | None = None
    fields: dict[str, str | None] = field(default_factory=dict)
    warm: bool = False

    @property
    def size(self) -> int:
        return sum(self.files.values())

    @property
    def ident(self) -> tuple[str, str]:
        """(kind, key): unique in an archive."""
        return self.kind.name, self.key

    @property
    def target(self) -> str | None:
        """The GPU target its code was compiled for (``sm_90``), where the kind keeps one."""
        return self.fields.get("target")

    def member(self, file_name: str) -> str:
        """The archive member that holds one of its files: where it lies below the cache root."""
        return "/".join(p for p in (self.kind.name, self.kind.carry_folder(self.key), file_name) if p)

    def as_json(self) -> dict[str, Any]:
        return {"key": self.key, "name": self.name, "files": self.files, "sha256": self.sha256,
                "size": self.size, "last_use": self.last_use, **self.fields,
                **({"warm": True} if self.warm else {})}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest_problem(entry: ManifestEntry, file_name: str, digest: str) -> str | None:
    """Why a file of ``entry`` whose SHA-256 is ``digest`` is not what was packed, or None."""
    if entry.sha256[file_name] != digest:
        return f"{shown(file_name)} differs from what was packed (its SHA-256)"
    return None


def member_mtime(member: Any) -> float:
    """A member's modification time (a ``tarfile.TarInfo``'s), no later than now."""
    value = member.mtime
    now = time.time()
    return min(float(value), now) if isinstance(value, (int, float)) and 0 <= value < 1 << 40 else now


def fill(fd: int, file_name: str, source: Any, member: Any, entry: ManifestEntry) -> None:
    """Write the member's data (``source.read``) into ``fd``, and check its SHA-256.

    Raises:
        Damaged: the data is not what was packed.
        Refused: the archive ended inside the member.
    """
    digest = hashlib.sha256()
    left = member.size
    while left:
        chunk = source.read(min(safe_io.CHUNK, left))
        if not chunk:
            raise Refused("the archive ended inside a member (truncated?)")
        digest.update(chunk)
        safe_io.write_all(fd, chunk)
        left -= len(chunk)
    problem = digest_problem(entry, file_name, digest.hexdigest())
    if problem:
        raise Damaged(problem)


def new_file(name: str, dir_fd: int | None, write: Callable[[int], None], mtime: float) -> None:
    """Make the file ``name`` in the folder ``dir_fd`` (never over one, never through a link),
    written by ``write(fd)``, with the times ``mtime``; it is removed again where that fails.

    Raises:
        Damaged, Refused: from ``write``; OSError.
    """
    fd = safe_io.new_file(name, dir_fd=dir_fd)
    try:
        write(fd)
        os.utime(fd, (mtime, mtime))
    except BaseException:
        with suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)
        raise
    finally:
        os.close(fd)


class Writer:
    """Writes one entry whole into its kind's folder ``folder`` (``dir_fd``: its descriptor);
    ``replace``: over an older or broken entry there. ``pending``: its files still to come."""

    def __init__(self, folder: Path, dir_fd: int, entry: ManifestEntry, replace: bool) -> None:
        self.folder, self.dir_fd, self.entry, self.replace = folder, dir_fd, entry, replace
        self.pending = set(entry.files)

    def add(self, file_name: str, source: Any, member: Any) -> None:
        """Write one file (``member``: its ``tarfile.TarInfo``; ``source.read``: its data)."""
        raise NotImplementedError

    def finish(self) -> bool:
        """Check the entry, then put it in place; False when a newer one appeared there
        meanwhile (kept).

        Raises:
            Damaged: what was written is not what was packed; nothing was put in place.
        """
        raise NotImplementedError

    def abandon(self) -> None:
        """Remove what this writer left behind (nothing once it has finished)."""
