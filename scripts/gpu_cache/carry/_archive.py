"""Reading an archive safely: decompressed by its magic bytes, its manifest checked first, and
every member shown to be a regular file that the manifest names, with its size, before it is
used. Nothing here writes."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import tarfile
import zlib
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from gpu_cache.core import safe_io
from gpu_cache.core.errors import UsageError

from ._format import MANIFEST_NAME, MAX_MANIFEST, ManifestEntry, Refused, parse_manifest, read_manifest, shown

#: Most bytes read from the archive at once (a file's data is read in smaller chunks; a tar
#: header is read whole, and a real one is a few KiB).
MAX_READ = 8 << 20
#: Room left for tar headers per member, and at the end of the archive.
_HEADER_ROOM = 4096
_END_ROOM = 64 << 10


class _Budget(io.RawIOBase):
    """A read-only view of a (decompressed) stream that refuses to go past ``limit`` bytes: a
    tar header that claims gigabytes (a PAX header bomb), or a seek past what the manifest
    announced, raises :class:`Refused` before it is read."""

    def __init__(self, stream: IO[bytes], limit: int) -> None:
        super().__init__()
        self.stream, self.limit = stream, limit

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def _check(self, end: int) -> None:
        if end > self.limit:
            raise Refused("the archive holds more than its manifest announces (a tar header or "
                          "member past the end)")

    def read(self, size: int | None = -1) -> bytes:
        position = self.stream.tell()
        if size is None or size < 0:
            size = self.limit - position
        if size > MAX_READ:  # tarfile reads a PAX or GNU long-name header whole
            raise Refused(f"the archive has a tar header of {size} bytes (a header bomb?)")
        self._check(position + size)
        return self.stream.read(size)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence == os.SEEK_SET:
            self._check(offset)
        elif whence == os.SEEK_CUR:
            self._check(self.stream.tell() + offset)
        else:
            raise io.UnsupportedOperation("seek from the end")
        return self.stream.seek(offset, whence)

    def tell(self) -> int:
        return self.stream.tell()


@contextmanager
def _decompressed(archive: Path) -> Iterator[IO[bytes]]:
    """The archive's tar stream, decompressed by its magic bytes (never by its name); a
    symbolic link the user names is followed, and anything but a regular file refused before
    it is read (a FIFO would block forever: #21).

    Raises:
        UsageError: it cannot be opened, or is not a regular file.
    """
    with ExitStack() as stack:
        try:
            fd = stack.enter_context(safe_io.open_regular(os.path.realpath(archive)))
        except safe_io.NotRegularFile as exc:
            raise UsageError(f"archive {archive} is {exc.what}, not a file") from None
        except OSError as exc:
            raise UsageError(f"cannot read archive {archive}: {exc.strerror or exc}") from None
        raw = stack.enter_context(os.fdopen(os.dup(fd), "rb"))
        head = raw.read(6)
        raw.seek(0)
        if head.startswith(b"\x1f\x8b"):
            stream: IO[bytes] = gzip.GzipFile(fileobj=raw, mode="rb")
        elif head.startswith(b"BZh"):
            stream = bz2.BZ2File(raw)
        elif head.startswith(b"\xfd7zXZ\x00"):
            stream = lzma.LZMAFile(raw)  # noqa: SIM115 - entered below
        else:
            stream = raw
        yield stack.enter_context(stream)


@dataclass
class _Expected:
    """What each member of the archive must be, from the manifest."""

    by_member: dict[str, tuple[ManifestEntry, str]]  # member name -> (entry, file name)
    total: int


def _expected(entries: Mapping[str, list[ManifestEntry]]) -> _Expected:
    by_member = {entry.member(name): (entry, name)
                 for items in entries.values() for entry in items for name in entry.files}
    return _Expected(by_member, sum(e.size for items in entries.values() for e in items))


def _check_member(member: tarfile.TarInfo, expected: _Expected, seen: set[str],
                  root: Path) -> tuple[ManifestEntry, str]:
    """The (entry, file name) a member holds, once it is shown to be safe.

    Raises:
        Refused: anything but a regular file that the manifest names, with its size.
    """
    name = member.name
    spec = expected.by_member.get(name)
    if not member.isreg() or member.issparse():
        what = ("a symbolic link" if member.issym() else "a hard link" if member.islnk()
                else "a device" if member.ischr() or member.isblk() else "a FIFO" if member.isfifo()
                else "a folder" if member.isdir() else "not a regular file")
        raise Refused(f"archive member {shown(name)} is {what}")
    if spec is None:
        raise Refused(f"archive member {shown(name)} is not named by the archive's manifest "
                      "(an absolute path, `..`, or a file of no entry)")
    if name in seen:
        raise Refused(f"archive member {shown(name)} comes twice")
    entry, file_name = spec
    if member.size != entry.files[file_name]:
        raise Refused(f"archive member {shown(name)} holds {member.size} bytes, its manifest says "
                      f"{entry.files[file_name]}")
    data_filter = getattr(tarfile, "data_filter", None)  # Python 3.12, and 3.11.4+
    if data_filter is not None:
        try:
            data_filter(member, str(root))
        except tarfile.FilterError as exc:
            raise Refused(f"archive member {shown(name)}: {exc}") from None
    seen.add(name)
    return spec


#: What reading a damaged (or cut) archive raises: tarfile's, the decompressors' (gzip's and
#: bz2's are OSErrors), EOF inside a compressed stream.
_READ_ERRORS = (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, OSError)


def _damaged(exc: BaseException) -> Refused:
    words = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return Refused(f"the archive is damaged ({shown(words)[1:-1]})")


class MemberReader:
    """A member's data, read from the archive; a damaged archive raises :class:`Refused`."""

    def __init__(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        reader = tar.extractfile(member)
        assert reader is not None  # a regular file: checked
        self.reader = reader

    def read(self, size: int) -> bytes:
        try:
            return self.reader.read(size)
        except _READ_ERRORS as exc:
            raise _damaged(exc) from None


@dataclass
class Archive:
    """An archive opened for reading: its manifest, its checked entries per kind, and what
    each member must be."""

    manifest: dict[str, Any]
    entries: dict[str, list[ManifestEntry]]
    _expected: _Expected
    _stream: IO[bytes]
    _budget: _Budget
    _manifest_size: int

    def members(self, root: Path) -> Iterator[tuple[MemberReader, tarfile.TarInfo, ManifestEntry, str]]:
        """Each member after the manifest, from the start of the archive, once it is shown to
        be safe: ``(its data, member, entry, file name)``. The files of one entry must come
        together, as pack writes them.

        Raises:
            Refused: an unsafe member, a damaged archive, or a member the manifest names is
                missing.
        """
        self._stream.seek(0)
        try:
            # not closed: closing a TarFile on a stream it did not open only marks it closed
            tar = tarfile.open(fileobj=self._budget, mode="r:")  # noqa: SIM115
            first = tar.next()
            if first is None or first.name != MANIFEST_NAME or first.size != self._manifest_size:
                raise Refused("the archive changed while it was read")
            seen: set[str] = set()
            done: set[tuple[str, str]] = set()
            current: tuple[str, str] | None = None
            while (member := tar.next()) is not None:
                entry, file_name = _check_member(member, self._expected, seen, root)
                if entry.ident != current:
                    if entry.ident in done:
                        raise Refused(f"archive member {shown(member.name)}: the files of one entry "
                                      "are not together, as `gpu-cache pack` writes them")
                    if current is not None:
                        done.add(current)
                    current = entry.ident
                yield MemberReader(tar, member), member, entry, file_name
        except _READ_ERRORS as exc:
            raise _damaged(exc) from None
        if len(seen) != len(self._expected.by_member):
            missing = next(n for n in self._expected.by_member if n not in seen)
            raise Refused(f"the archive lacks {shown(missing)}, which its manifest names (truncated?)")


@contextmanager
def open_archive(archive: Path) -> Iterator[Archive]:
    """The archive, opened, with its manifest read and checked.

    Raises:
        UsageError: not a readable gpu-cache archive, or a manifest this version cannot read.
        Refused: its manifest names unsafe entries.
    """
    with _decompressed(archive) as stream:
        budget = _Budget(stream, MAX_MANIFEST + _END_ROOM)
        try:
            tar = tarfile.open(fileobj=budget, mode="r:")  # noqa: SIM115 - as in Archive.members
            first = tar.next()
            if first is None or first.name != MANIFEST_NAME or not first.isreg() \
                    or first.size > MAX_MANIFEST:
                raise UsageError(f"{archive} is not a gpu-cache archive (its first member is not "
                                 f"{MANIFEST_NAME}); make one with `gpu-cache pack`")
            reader = tar.extractfile(first)
            assert reader is not None
            text = b"".join(iter(lambda: reader.read(safe_io.CHUNK), b""))
        except tarfile.TarError as exc:
            raise UsageError(f"{archive} is not a gpu-cache archive: not a tar file ({exc})") from None
        except (OSError, EOFError, zlib.error, lzma.LZMAError) as exc:
            raise UsageError(f"cannot read archive {archive}: {exc}") from None
        try:
            manifest = parse_manifest(text)
            entries = read_manifest(manifest)
        except UsageError as exc:
            raise UsageError(f"{archive}: {exc}") from None
        expected = _expected(entries)
        budget.limit = (budget.tell() + first.size + expected.total + _END_ROOM
                        + _HEADER_ROOM * (len(expected.by_member) + 1))
        yield Archive(manifest, entries, expected, stream, budget, first.size)
