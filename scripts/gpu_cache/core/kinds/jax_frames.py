"""Whether a JAX ``-cache`` file is what JAX wrote: its zstd frame walked block by block
(:class:`ZstdFrame`, from its headers alone), and its bytes decompressed where a zstd library
is installed (zlib always), streamed and bounded against decompression bombs. The inventory
(:mod:`gpu_cache.core.kinds.jax_format`) verifies entries with it; ``pack`` and ``unpack`` check
what they carry. Standard library only, Python 3.9+.
"""

from __future__ import annotations

import os
import zlib
from typing import Any

from gpu_cache.core import safe_io

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: Verification stops (and calls the entry broken) past this many decompressed bytes, or
#: :data:`VERIFY_MAX_RATIO` times the compressed size when that is larger. A compiled
#: executable compresses 2-5x; a decompression bomb (zlib up to 1032x, zstd far more) is cut
#: off here after about a second of work, without ever holding more than a chunk.
VERIFY_MAX_PLAIN = 512 << 20
VERIFY_MAX_RATIO = 64
#: Output per decompression step; zstd input is fed in steps this small because one zstd
#: block of 4 input bytes can stand for 128 KiB of output.
_PLAIN_STEP = 1 << 20
_ZSTD_INPUT_STEP = 1 << 10
_ZLIB_TYPE = type(zlib.decompressobj())


def _zstd_decompressor() -> Any:
    """A streaming zstd decompressor of the library JAX itself would use, or None."""
    try:
        from compression import zstd  # type: ignore[import-not-found]  # Python 3.14+

        return zstd.ZstdDecompressor()
    except ImportError:
        pass
    try:
        import zstandard  # type: ignore[import-not-found]
    except ImportError:
        return None
    return zstandard.ZstdDecompressor().decompressobj()


class _Inflate:
    """Feeds a stream's chunks through ``decompressor`` and counts the output, holding at most
    one bounded piece of it at a time; ``done`` at the end of the stream or past ``limit``."""

    def __init__(self, decompressor: Any, limit: int) -> None:
        self.decompressor = decompressor
        self.limit = limit
        self.total = 0
        self.done = False
        self.takes_max_length = isinstance(decompressor, _ZLIB_TYPE) or hasattr(decompressor, "needs_input")

    def feed(self, chunk: bytes) -> None:
        decompressor = self.decompressor
        if self.takes_max_length:  # zlib, compression.zstd
            data = chunk
            while True:
                out = decompressor.decompress(data, _PLAIN_STEP)
                self.total += len(out)
                if decompressor.eof or self.total > self.limit:
                    self.done = True
                    return
                data = getattr(decompressor, "unconsumed_tail", b"")
                if not data and not out:
                    return  # this chunk is used up and nothing is pending
        else:  # zstandard's decompressobj has no max_length: feed it small pieces instead
            for start in range(0, len(chunk), _ZSTD_INPUT_STEP):
                self.total += len(decompressor.decompress(chunk[start:start + _ZSTD_INPUT_STEP]))
                if decompressor.eof or self.total > self.limit:
                    self.done = True
                    return


#: The largest block a zstd frame may hold, compressed or not (RFC 8878, Block_Maximum_Size).
ZSTD_BLOCK_MAX = 128 << 10
_TRUNCATED = "truncated -cache file (the writer ran out of space or was killed)"


class ZstdFrame:
    """Whether a zstd frame is whole, from its headers alone (RFC 8878), fed as its bytes
    arrive: the frame header (its content size, whether a checksum follows), then each
    block's 3-byte header (last-block bit, type, size), skipping the block bodies, then the
    checksum. No decoder is needed: gpu-cache's own Python may lack ``zstandard`` while the
    jobs that wrote the entries have it. Only the first bytes of a header are ever held."""

    def __init__(self) -> None:
        self.content_size: int | None = None  # announced by the frame header
        self.plain = 0  # bytes the raw and RLE blocks give: the output is at least this
        self.compressed = 0  # compressed blocks (each gives at most ZSTD_BLOCK_MAX bytes)
        self.problem: str | None = None
        self._header = bytearray()
        self._need = 5  # the magic number and the frame header descriptor
        self._state = "start"
        self._skip = 0
        self._checksum = False
        self._content_bytes = 0
        self._trailing = 0

    def feed(self, data: bytes) -> None:
        position, end = 0, len(data)
        while position < end and self.problem is None:
            if self._skip:
                step = min(self._skip, end - position)
                self._skip -= step
                position += step
            elif self._state == "end":
                self._trailing += end - position
                return
            else:
                take = min(self._need - len(self._header), end - position)
                self._header += data[position:position + take]
                position += take
                if len(self._header) == self._need:
                    header = bytes(self._header)
                    self._header.clear()
                    self._read(header)

    def _read(self, header: bytes) -> None:
        if self._state == "start":
            if header[:4] != _ZSTD_MAGIC:
                self.problem = "-cache file is not a zstd frame"
                return
            descriptor = header[4]
            if descriptor & 0x08:
                self.problem = "-cache file's zstd frame header has its reserved bit set (corrupt)"
                return
            single_segment = bool(descriptor & 0x20)
            self._checksum = bool(descriptor & 0x04)
            self._content_bytes = (int(single_segment), 2, 4, 8)[descriptor >> 6]
            rest = (not single_segment) + (0, 1, 2, 4)[descriptor & 0x03] + self._content_bytes
            self._state, self._need = ("header", rest) if rest else ("block", 3)
        elif self._state == "header":
            if self._content_bytes:
                size = int.from_bytes(header[-self._content_bytes:], "little")
                self.content_size = size + 256 if self._content_bytes == 2 else size
            self._state, self._need = "block", 3
        else:
            value = int.from_bytes(header, "little")
            kind, size = (value >> 1) & 0x03, value >> 3
            if kind == 3 or size > ZSTD_BLOCK_MAX:
                self.problem = "-cache file holds a zstd block that cannot be (corrupt)"
                return
            if kind == 2:
                self.compressed += 1
            else:
                self.plain += size
            self._skip = 1 if kind == 1 else size  # an RLE block repeats its one byte
            if value & 1:  # the last block
                self._skip += 4 if self._checksum else 0
                self._state = "end"

    def finish(self) -> str | None:
        """Why the bytes fed are not one whole zstd frame, or None."""
        if self.problem is not None:
            return self.problem
        if self._state != "end" or self._skip or self._header:
            return _TRUNCATED
        if self._trailing:
            return f"-cache file holds {self._trailing} bytes after the end of its zstd frame"
        size = self.content_size
        if size is not None and not self.plain <= size <= self.plain + self.compressed * ZSTD_BLOCK_MAX:
            return f"-cache file's zstd header announces {size} bytes, which its blocks cannot hold (corrupt)"
        return None


def examine(path: str | os.PathLike[str]) -> tuple[str | None, int | None]:
    """Why the ``-cache`` file at ``path`` cannot be what JAX wrote (None: it can), and the
    CRC-32 of its bytes (None unless it can).

    JAX compresses with zstd when ``zstandard`` (or Python 3.14's ``compression.zstd``) is
    importable, else with zlib, and puts a 4-byte compile time before the executable. A zstd
    frame is walked block by block (:class:`ZstdFrame`: a frame that ends before its last
    block is truncated) and, where a zstd library is installed, also decompressed; it must
    then give the bytes its header announces. A zlib stream must reach its end marker. The
    file is streamed: never more than a chunk of it or of its output is held, and the output
    is bounded (:data:`VERIFY_MAX_PLAIN`).
    """
    try:
        size = os.lstat(path).st_size
        chunks = safe_io.iter_chunks(path)
        first = next(chunks, b"")
    except safe_io.NotRegularFile as exc:
        return f"-cache is {exc.what}, not a regular file", None
    except OSError:
        return None, None  # gone or unreadable: not this check's business
    crc = zlib.crc32(first)
    limit = max(VERIFY_MAX_PLAIN, VERIFY_MAX_RATIO * size)
    frame = ZstdFrame() if first.startswith(_ZSTD_MAGIC) else None
    decompressor = _zstd_decompressor() if frame else zlib.decompressobj()
    inflate = None if decompressor is None else _Inflate(decompressor, limit)
    try:
        chunk: bytes | None = first
        while chunk is not None:
            if frame is not None:
                frame.feed(chunk)
            if inflate is not None and not inflate.done:
                inflate.feed(chunk)
                if inflate.total > limit:
                    break
            chunk = next(chunks, None)
            if chunk is not None:
                crc = zlib.crc32(chunk, crc)
    except OSError:
        return None, None  # unreadable midway: not this check's business
    except Exception as exc:  # noqa: BLE001 - zlib.error, zstandard.ZstdError: both mean corrupt
        return f"-cache file does not decompress ({type(exc).__name__}: {exc})", None
    finally:
        chunks.close()
    plain = inflate.total if inflate is not None else None
    if (plain if plain is not None else frame.plain if frame is not None else 0) > limit:
        return (f"-cache file decompresses to more than {limit} bytes from {size} "
                "(a decompression bomb?)"), None
    if frame is not None:
        problem = frame.finish()
        if problem is not None:
            return problem, None
        if plain is None:
            plain = frame.content_size
    if inflate is not None and (not inflate.decompressor.eof or (
            frame is not None and frame.content_size is not None and plain != frame.content_size)):
        return _TRUNCATED, None
    if plain is not None and plain <= 4:
        return "-cache file holds no executable", None
    return None, crc


def undecompressable(path: str | os.PathLike[str]) -> str | None:
    """Why the ``-cache`` file at ``path`` cannot be what JAX wrote, or None (:func:`examine`)."""
    return examine(path)[0]


