"""What carrying an entry to another machine asks of a kind (``gpu-cache pack``/``unpack``,
``publish``/``fetch``: :mod:`gpu_cache.carry`, docs/kinds.md): a carried kind has a
:class:`Carry` (``kind.carry``; None: not carried), which says what pack takes (:class:`Carried`),
what an entry may be as an archive's manifest names it (:class:`ManifestEntry`), and makes the
writer that puts one in place whole on unpack (:class:`Writer`). ``carry/`` is generic; each
carried kind's own :class:`Carry` is in ``<kind>_carry.py`` beside it, which builds on this module.

Every name here comes from an archive, which is untrusted: :func:`shown` escapes it for a
message, and a writer checks what it wrote before it puts it in place (:class:`Damaged`).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Collection
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_cache.core import safe_io
from gpu_cache.core.kinds.kind import texts

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
    what the manifest says of it beyond that (``fields``: its kind's :attr:`Carry.fields`),
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
    :attr:`Carry.fields`: Triton's ``kind`` and ``target``, an autotuning result's
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
        return "/".join(p for p in (self.kind.name, self.kind.carry.folder(self.key), file_name) if p)

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


class Carry:
    """How one kind's entries are carried: made for its kind (``kind``) as the kind is made, which
    has it as ``kind.carry``. A carried kind's part implements :meth:`entries`, :meth:`names_ok`
    and :meth:`writers`, and overrides what differs from the default. It imports the kind's
    format where it uses it: every command makes the kinds, and most read no entry."""

    #: The fields an archive's manifest keeps of each entry beyond its files (text each).
    fields: tuple[str, ...] = ()
    #: What of the GPU its entries hold, which unpack checks against the GPU type it is told:
    #: ``"device"`` (compiled for the device of the passes that wrote them, named in their
    #: records), ``"target"`` (compiled for the compute target in their ``target`` field), None
    #: (nothing: each entry names the device it serves, and only that device reads it).
    device: str | None = "target"
    #: The distributions whose versions its keys hold, its own first (in words: ``jax-triton
    #: 0.3.1 with triton 3.6.0``): entries made with other versions do not serve.
    keyed_by: tuple[str, ...] = ()
    #: Whether its keys (or what its entries load) hold Python's minor version too.
    keyed_by_python: bool = False

    def __init__(self, kind: Kind) -> None:
        self.kind = kind

    def entries(self, folder: Path, wanted: set[str] | None) -> list[Carried]:
        """The entries of ``folder`` that pack takes (of the keys ``wanted``, when given), each
        with its files; a broken one (``problem``) is left out and listed."""
        raise NotImplementedError

    def folder(self, key: str) -> str:
        """Where the files of the entry ``key`` lie, relative to the kind's folder ("": in it)."""
        return ""

    def names_ok(self, key: str, files: Collection[str]) -> bool:
        """Whether an entry of this kind can have the key ``key`` and the file names ``files``
        (an archive's manifest: what would be written where)."""
        raise NotImplementedError

    def whole(self, file_name: str) -> tuple[int, bool] | None:
        """How unpack's first pass reads a file of this name: (at most this many bytes read
        whole and checked with :meth:`member`; always, or only in a dry run that reads
        everything), or None: its digest alone."""
        return None

    def member(self, entry: ManifestEntry, file_name: str, data: bytes) -> str | None:
        """Why a file of ``entry`` (read whole, as packed: its digest holds) is not what jobs
        read, or None.

        Raises:
            Refused: it is as packed, and unsafe (an archive made to write elsewhere).
        """
        return None

    def writers(self, folder: Path, dir_fd: int) -> Callable[[ManifestEntry, bool], Writer]:
        """What makes the writer of each entry that unpack puts into ``folder`` (``dir_fd``: its
        descriptor), given the entry and whether it replaces one there; made once per unpack."""
        raise NotImplementedError

    def recorded_keys(self, record: dict[str, Any]) -> set[str]:
        """The keys of the kind's entries that a record's process hit or wrote (what pack takes
        of a validated pass)."""
        section = self.kind.section(record)
        if section is None:
            return set()
        missed = section.get("missed")
        return set(texts(section.get("hit_keys"))) | (
            {m["key"] for m in missed if isinstance(m, dict) and isinstance(m.get("key"), str)}
            if isinstance(missed, list) else set())

    def software_of(self, identity: dict[str, Any]) -> tuple[Any, ...]:
        """The parts of a software identity (:func:`gpu_cache.core.software.identity`) that the
        kind's keys depend on (:attr:`keyed_by`): entries made with others do not serve."""
        from gpu_cache.core import software

        python = (software.minor(identity.get("python")),) if self.keyed_by_python else ()
        return tuple(identity.get(name) for name in self.keyed_by) + python

    def software_words(self, identity: dict[str, Any]) -> str:
        """That software in words: ``triton 3.6.0 on Python 3.12``."""
        from gpu_cache.core import software

        python = identity.get("python") or "?"
        if not self.keyed_by:
            return f"Python {python}"
        own, *others = self.keyed_by
        if not identity.get(own):
            return f"no {own} (Python {python})"
        words = " with ".join([f"{own} {identity[own]}",
                               *(f"{other} {identity.get(other) or 'none'}" for other in others)])
        on_python = f" on Python {software.minor(identity.get('python'))}" if self.keyed_by_python else ""
        return words + on_python

    def entries_software(self, entries: list[ManifestEntry]) -> list[dict[str, Any]] | None:
        """The software identities the ``entries`` name themselves, newest first, or None: the
        records of the passes that wrote them tell."""
        return None

    def path_in_key(self, identity: dict[str, Any], records: list[dict[str, Any]]) -> bool | None:
        """Whether entries made with ``identity`` by the processes of ``records`` hold their
        folder's path in their keys (they then hit only there); None: not known."""
        return False
