"""The outputs of a workload run, read and compared, for the verdict's proof that the cache
serves the very compile it holds (issues 40 and 47, docs/outputs.md).

A run reports its outputs as a file: a built-in workload writes ``$GPU_CACHE_OUTPUTS`` (an
``.npz``), a command of the user's the file its config's ``outputs:`` names. ``.npy`` and
``.npz`` files are read here by their numbers (standard library only: the numpy file format
is a small header and the raw values), anything else as its bytes. Beside it, the same
outputs of a second run of the same compiled program in the same process may lie in
``<stem>.again<suffix>``: how far the two lie apart, array by array, is the program's
run-to-run noise. Which outputs are compared with which is :mod:`gpu_cache.core.references`'.
"""

from __future__ import annotations

import array
import ast
import hashlib
import math
import os
import struct
import sys
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_cache.core import safe_io, state_files

#: An outputs file larger than this is not compared (a note says so).
MAX_BYTES = 256 << 20
#: A numpy header longer than this is none numpy wrote.
MAX_HEADER = 1 << 16
#: The second run's file: ``outputs.npz`` -> ``outputs.again.npz``.
AGAIN = ".again"
MAGIC = b"\x93NUMPY"
#: numpy's type codes (without the byte order) and the ``struct`` format of one value.
CODES = {"f2": "e", "f4": "f", "f8": "d", "i1": "b", "u1": "B", "i2": "h", "u2": "H", "i4": "i",
         "u4": "I", "i8": "q", "u8": "Q", "b1": "?"}
NATIVE = "<" if sys.byteorder == "little" else ">"


class OutputsError(ValueError):
    """An outputs file that cannot be read as what its name says."""


@dataclass(frozen=True)
class Array:
    """One array of an outputs file: numpy's type description, its shape, its raw values."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes
    fortran: bool = False

    def numbers(self) -> Sequence[float] | None:
        """Its values as numbers (a view, not a copy), or None for what is compared only by
        its bytes (text, records, another byte order, a file that was not numpy's)."""
        code = CODES.get(self.dtype[1:]) if len(self.dtype) == 3 else None
        if code is None or self.dtype[0] not in ("|", "=", NATIVE):
            return None
        size = len(self.data) - len(self.data) % struct.calcsize(code)
        if code == "e":  # half precision: memoryview cannot cast to it
            return array.array("f", (v for (v,) in struct.iter_unpack(code, self.data[:size])))
        return memoryview(self.data)[:size].cast(code)

    @property
    def floating(self) -> bool:
        return self.dtype[1:2] == "f"


def again_of(path: str) -> str:
    """The second run's file beside ``path``."""
    stem, suffix = os.path.splitext(path)
    return f"{stem}{AGAIN}{suffix}"


def parse_npy(data: bytes) -> Array:
    """An array from the bytes of a ``.npy`` file (versions 1 to 3; no pickled objects).

    Raises:
        OutputsError: not such a file.
    """
    if not data.startswith(MAGIC) or len(data) < 10:
        raise OutputsError("not a .npy file (no numpy header)")
    major = data[6]
    width = 2 if major == 1 else 4
    length = int.from_bytes(data[8:8 + width], "little")
    if length > MAX_HEADER:
        raise OutputsError(f"a .npy header of {length} bytes")
    start = 8 + width + length
    try:
        header = ast.literal_eval(data[8 + width:start].decode("latin1"))
        descr, shape, fortran = header["descr"], tuple(header["shape"]), bool(header["fortran_order"])
    except (ValueError, SyntaxError, KeyError, TypeError, MemoryError, RecursionError):
        raise OutputsError("a .npy header that is not numpy's") from None
    if not all(isinstance(n, int) and n >= 0 for n in shape):
        raise OutputsError(f"a .npy shape of {shape!r}")
    return Array(descr if isinstance(descr, str) else repr(descr), shape, data[start:], fortran)


def parse(path: str, data: bytes) -> dict[str, Array]:
    """The arrays of the outputs file ``path`` that holds ``data``: a ``.npy`` file's one array
    (named ""), each array of an ``.npz``, or any other file's bytes (named "", type ``bytes``).

    Raises:
        OutputsError: it is not what its name says.
    """
    if path.endswith(".npy"):
        return {"": parse_npy(data)}
    if not path.endswith(".npz"):
        return {"": Array("bytes", (len(data),), data)}
    import io

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.infolist()
            if sum(m.file_size for m in members) > MAX_BYTES:
                raise OutputsError(f"an .npz of more than {MAX_BYTES} bytes unpacked")
            return {m.filename[:-len(".npy")] if m.filename.endswith(".npy") else m.filename:
                    parse_npy(archive.read(m)) for m in members}
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError) as exc:
        raise OutputsError(f"not an .npz file ({exc})") from None


def digest(arrays: Mapping[str, Array]) -> str:
    """One sha256 over every array's name, type, shape, order and values."""
    total = hashlib.sha256()
    for name in sorted(arrays):
        item = arrays[name]
        total.update(repr((name, item.dtype, item.shape, item.fortran, len(item.data))).encode())
        total.update(item.data)
    return total.hexdigest()


def nonfinite(arrays: Mapping[str, Array]) -> int:
    """How many values are NaN or infinite."""
    count = 0
    for item in arrays.values():
        values = item.numbers() if item.floating else None
        if values is not None:
            count += len(values) - sum(map(math.isfinite, values))
    return count


@dataclass
class Gap:
    """How one array of a run lies from the reference's: the largest absolute difference of a
    value (``max_abs``), the reference's largest finite magnitude (``scale``), values NaN or
    infinite where the reference's are finite (``new``), and NaN or infinite values of the
    reference that moved or turned finite (``moved``); ``exact``: integers or booleans."""

    max_abs: float = 0.0
    scale: float = 0.0
    new: int = 0
    moved: int = 0
    exact: bool = False

    @property
    def rel(self) -> float:
        """``max_abs`` relative to the array's own magnitude (the tolerance's measure)."""
        return self.max_abs / self.scale if self.scale else self.max_abs


def gaps(reference: Mapping[str, Array], run: Mapping[str, Array]) -> tuple[dict[str, Gap], list[str]]:
    """How each array of ``run`` that differs lies from ``reference`` (identical arrays are left
    out), and what cannot be compared by numbers: other names, shapes or types, or bytes that
    differ (``mismatch``)."""
    found: dict[str, Gap] = {}
    mismatch = []
    for name in sorted(set(reference) | set(run)):
        want, got = reference.get(name), run.get(name)
        if want is None or got is None:
            mismatch.append(f"{name or 'the array'} is {'new' if want is None else 'gone'}")
        elif (want.dtype, want.shape, want.fortran) != (got.dtype, got.shape, got.fortran):
            mismatch.append(f"{name or 'the array'} is {got.dtype}{list(got.shape)}, "
                            f"not {want.dtype}{list(want.shape)}")
        elif want.data != got.data:
            wanted, values = want.numbers(), got.numbers()
            if wanted is None or values is None:
                mismatch.append(f"{name or 'the file'}'s bytes differ")
            else:
                found[name] = _gap(wanted, values, not want.floating)
    return found, mismatch


def _gap(wanted: Sequence[float], values: Sequence[float], exact: bool) -> Gap:
    gap = Gap(exact=exact)
    for b, a in zip(wanted, values):
        if a == b:
            continue
        if not math.isfinite(b):
            if not (a != a and b != b):  # NaN for NaN is no change
                gap.moved += 1
        elif not math.isfinite(a):
            gap.new += 1
        else:
            gap.max_abs = max(gap.max_abs, abs(a - b))
    gap.scale = max((abs(b) for b in wanted if math.isfinite(b)), default=0.0)
    return gap


def spreads(first: Mapping[str, Array], again: Mapping[str, Array] | None) -> dict[str, float] | None:
    """The run-to-run noise of one process, array by array: the largest difference between its
    two runs of the same compiled program (infinite where they differ in kind: shapes, NaN);
    arrays that agree are left out. None: it ran once."""
    if again is None:
        return None
    found, mismatch = gaps(first, again)
    if mismatch:
        return dict.fromkeys(first, math.inf)
    return {name: math.inf if gap.new or gap.moved else gap.max_abs for name, gap in found.items()}


def compared(reference: Mapping[str, Array], run: Mapping[str, Array],
             noise: Mapping[str, float]) -> dict[str, Any]:
    """The figures of how ``run`` differs from ``reference``, which the host judges
    (``gpu_cache.commands.outputs_proof``): ``max_abs`` (the largest difference of a value),
    ``max_rel`` (the largest over the floating-point arrays of that relative to the array's own
    magnitude), ``new_nonfinite``, ``mismatch``; ``within_noise``: every array's difference is
    within ``noise`` (the run-to-run noise of the program, array by array) and no NaN or
    infinity appeared or moved; ``beyond_noise_rel``: the largest relative difference of a
    floating-point array beyond its noise (what a tolerance may allow); ``exact_differs``: an
    integer or boolean array differs beyond its noise, or a NaN or infinity moved (no
    tolerance allows either)."""
    found, mismatch = gaps(reference, run)
    beyond = {name: gap for name, gap in found.items() if gap.max_abs > noise.get(name, 0.0)}
    return {"max_abs": number(max((g.max_abs for g in found.values()), default=0.0)),
            "max_rel": number(max((g.rel for g in found.values() if not g.exact), default=0.0)),
            "new_nonfinite": sum(g.new for g in found.values()),
            "mismatch": "; ".join(mismatch)[:500] or None,
            "within_noise": not mismatch and not beyond and not any(g.new or g.moved for g in found.values()),
            "beyond_noise_rel": number(max((g.rel for g in beyond.values() if not g.exact), default=0.0)),
            "exact_differs": any(g.exact for g in beyond.values()) or any(g.moved for g in found.values())}


def noise_of(*spread: Mapping[str, float] | None) -> dict[str, float]:
    """The noise each array may show: the larger of the processes' own spreads."""
    out: dict[str, float] = {}
    for one in spread:
        for name, value in (one or {}).items():
            out[name] = max(out.get(name, 0.0), value)
    return out


def figure(value: Any) -> float | None:
    """A figure as JSON keeps it, read back (``"inf"`` is infinite; anything else unknown)."""
    if value == "inf":
        return math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def number(value: float | None) -> float | str | None:
    """A figure as JSON keeps it: an infinite one as text (JSON has no infinity)."""
    if value is None or math.isfinite(value):
        return None if value is None else float(f"{value:.6g}")
    return "inf"


def load(path: str, root: Path | None = None) -> tuple[bytes, dict[str, Array]]:
    """The bytes of an outputs file and its arrays by name (:func:`parse`); ``root``: it is
    gpu-cache's own, kept in that cache root's state folder, and read by the trust rule
    (:func:`gpu_cache.core.state_files.read`).

    Raises:
        FileNotFoundError: there is none.
        OutputsError: it is not what its name says.
        state_files.Untrusted: (``root``) another account may have written it.
        OSError: it cannot be read, is not a regular file or is larger than :data:`MAX_BYTES`.
    """
    data = (safe_io.read_bounded(path, MAX_BYTES) if root is None
            else state_files.read(Path(path), root, MAX_BYTES))
    return data, parse(path, data)


