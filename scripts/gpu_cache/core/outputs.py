"""The outputs of a workload run, for the verdict's proof that the warm cache computes what a
fresh compile computes (issue 40, docs/outputs.md).

A run reports its outputs as a file: a built-in workload writes ``$GPU_CACHE_OUTPUTS`` (an
``.npz``), a command of the user's the file its config's ``outputs:`` names. ``.npy`` and
``.npz`` files are read here by their numbers (standard library only: the numpy file format
is a small header and the raw values), anything else as its bytes. Beside it, the same
outputs of a second run of the same compiled program in the same process may lie in
``<stem>.again<suffix>``: how far the two lie apart is the program's run-to-run noise.

The cold pass (every cache off: each program compiled fresh) keeps its outputs as the
reference, in ``<root>/state/outputs-<fingerprint>-<environment>/``; each run of the validate pass (fresh
processes that hit the cache) is compared with it, and the host judges the comparison.
"""

from __future__ import annotations

import array
import ast
import hashlib
import math
import os
import shutil
import stat
import struct
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_cache.core import kinds, names, safe_io, state_files

#: An outputs file larger than this is not compared (a note says so).
MAX_BYTES = 256 << 20
#: A numpy header longer than this is none numpy wrote.
MAX_HEADER = 1 << 16
#: The second run's file: ``outputs.npz`` -> ``outputs.again.npz``.
AGAIN = ".again"
#: A reference's folder in the root's state folder: ``outputs-<fingerprint>-<environment>``.
REFERENCE_PREFIX = "outputs-"
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


def difference(reference: Mapping[str, Array], run: Mapping[str, Array]) -> dict[str, Any]:
    """How ``run`` differs from ``reference``: the largest absolute difference of a value, that
    over the reference's largest magnitude (``max_rel``), the values that are NaN or infinite
    where the reference's are finite (``new_nonfinite``), and what cannot be compared by
    numbers (``mismatch``: other names, shapes or types, or bytes that differ)."""
    max_abs, scale, new, mismatch = 0.0, 0.0, 0, []
    for name in sorted(set(reference) | set(run)):
        want, got = reference.get(name), run.get(name)
        if want is None or got is None:
            mismatch.append(f"{name or 'the array'} is {'new' if want is None else 'gone'}")
            continue
        if (want.dtype, want.shape, want.fortran) != (got.dtype, got.shape, got.fortran):
            mismatch.append(f"{name or 'the array'} is {got.dtype}{list(got.shape)}, "
                            f"not {want.dtype}{list(want.shape)}")
            continue
        if want.data == got.data:
            continue
        wanted, values = want.numbers(), got.numbers()
        if wanted is None or values is None:
            mismatch.append(f"{name or 'the file'}'s bytes differ")
            continue
        for b, a in zip(wanted, values):
            if a == b:
                continue
            if not math.isfinite(b):
                if math.isfinite(a) or not (a != a and b != b):  # NaN for NaN is no change
                    max_abs = math.inf
                continue
            if not math.isfinite(a):
                new += 1
                continue
            max_abs = max(max_abs, abs(a - b))
        scale = max(scale, max((abs(b) for b in wanted if math.isfinite(b)), default=0.0))
    return {"max_abs": max_abs, "max_rel": max_abs / scale if scale else max_abs,
            "new_nonfinite": new, "mismatch": "; ".join(mismatch)[:500] or None}


def spread(first: Mapping[str, Array], again: Mapping[str, Array] | None) -> float | None:
    """The run-to-run noise of one process: the largest difference between its two runs of
    the same compiled program (None: it ran once)."""
    if again is None:
        return None
    found = difference(first, again)
    return math.inf if found["mismatch"] or found["new_nonfinite"] else found["max_abs"]


def reference_folder(root: Path | None, fingerprint: str | None, environ: Mapping[str, str]
                     ) -> Path | None:
    """Where the cold pass of these inputs (``fingerprint``: workloads, shapes, software,
    device) keeps its outputs, apart for each value of the variables that change what a
    compiled program computes (``XLA_FLAGS``, ``TRITON_DEFAULT_FP_FUSION``, ...: a job that
    sets another compiles other programs, and its reference is another cold pass's)."""
    if root is None or not fingerprint:
        return None
    compute = sorted((name, environ.get(name)) for name in kinds.KEY_ENVIRONMENT
                     if name != names.JAX_CACHE_DIR_VAR)  # where the cache is changes nothing computed
    tail = hashlib.sha256(repr(compute).encode()).hexdigest()[:12]
    return root / names.STATE_FOLDER / f"{REFERENCE_PREFIX}{fingerprint}-{tail}"


@dataclass(frozen=True)
class Reference:
    """A cold pass's outputs kept in the root's state folder (:func:`reference_folder`): its
    folder's name, the fingerprint of its inputs, its bytes, and when a pass last kept or
    compared with it (the folder's newest mtime: each validate pass touches it)."""

    name: str
    fingerprint: str
    size: int
    last_use: float


def references(state: Path) -> list[Reference]:
    """The references in the state folder ``state`` (folders only: a link is none gpu-cache made)."""
    found = []
    for name, path, info in safe_io.listing(state):
        parts = name[len(REFERENCE_PREFIX):].split("-")
        if name.startswith(REFERENCE_PREFIX) and len(parts) == 2 and stat.S_ISDIR(info.st_mode):
            size, _files, newest = safe_io.tree_size(path)
            found.append(Reference(name, parts[0], size, max(info.st_mtime, newest)))
    return found


def kept(folder: Path | None, runs: Iterable[Any]) -> bool:
    """Whether the outputs of an earlier cold pass's ``runs`` (its :class:`RunResult` s) are
    all in ``folder``: a run that reported outputs has its reference there."""
    for run in runs:
        found = run.outputs
        if found is None:
            return False  # measured before outputs were collected
        if "error" in found:
            continue
        if folder is None or not (folder / (slug(run.workload, run.shape)
                                            + os.path.splitext(str(found.get("file")))[1])).is_file():
            return False
    return True


def slug(workload: str, shape: Any) -> str:
    """The name of one run's reference (a workload and shape are any text)."""
    return hashlib.sha256(f"{workload}\0{shape}".encode()).hexdigest()[:24]


def wildcards(workload: str, shape: Any) -> str:
    """What the records of one run name it by (``$GPU_CACHE_WILDCARDS``): its workload and shape."""
    return f"workload={workload},shape={shape}"


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


def _forget(path: str) -> None:
    """Remove a user's outputs file (and its second run's) before a run, so that a run that
    writes none is not credited with an earlier run's (a link is removed, not followed)."""
    for name in (path, again_of(path)):
        try:
            os.unlink(name)
        except OSError:
            pass  # none there, or not ours to remove: then it is read as it is


class Run:
    """One run's outputs: the environment it runs with (its wildcards, and for a built-in
    workload ``$GPU_CACHE_OUTPUTS``), and its :meth:`report` once it has ended."""

    def __init__(self, environ: dict[str, str], path: str | None, why_none: str | None,
                 phase: str, folder: Path | None, name: str) -> None:
        self.environ, self.path, self.why_none = environ, path, why_none
        self.phase, self.folder, self.name = phase, folder, name

    def report(self, ok: bool) -> dict[str, Any] | None:
        """What the run's outputs are and, in the validate pass, how they compare with the
        cold pass's; None where outputs are not collected."""
        if self.path is None:
            return None if self.why_none is None else {"error": self.why_none}
        if not ok:
            return {"error": "the run failed"}
        try:
            data, first = load(self.path)
        except FileNotFoundError:
            return {"error": f"the run wrote no outputs ({self.path})"}
        except (OSError, OutputsError) as exc:
            return {"error": f"its outputs ({self.path}) cannot be read: {exc}"}
        try:
            again_data, again = load(again_of(self.path))
        except (OSError, OutputsError):
            again_data, again = None, None
        out: dict[str, Any] = {"file": self.path, "digest": digest(first),
                               "bytes": sum(len(a.data) for a in first.values()),
                               "nonfinite": nonfinite(first), "spread": number(spread(first, again))}
        if self.phase == "cold":
            out["kept"] = self._keep(data, again_data)
        elif self.phase == "validate":
            out["reference"] = self._compare(first)
        return out

    def _target(self) -> str | None:
        if self.folder is None or self.path is None:
            return None
        return str(self.folder / (self.name + os.path.splitext(self.path)[1]))

    def _keep(self, data: bytes, again: bytes | None) -> bool:
        """Keep the cold pass's outputs as the reference of these inputs."""
        target = self._target()
        if target is None or self.folder is None:
            return False
        try:
            state_files.make(self.folder.parent.parent, self.folder.name)
            safe_io.replace_file(target, data)
            if again is not None:
                safe_io.replace_file(again_of(target), again)
            elif os.path.lexists(again_of(target)):
                os.unlink(again_of(target))
        except OSError:
            return False  # an unusable root: the validate pass then finds no reference
        return True

    def _compare(self, first: Mapping[str, Array]) -> dict[str, Any] | None:
        """The reference's figures and how ``first`` differs from it (None: none kept)."""
        target = self._target()
        try:
            if target is None or self.folder is None:
                return None
            reference = load(target, self.folder.parent.parent)[1]
        except state_files.Untrusted as exc:
            return {"untrusted": str(exc)}
        except (OSError, OutputsError):
            return None
        try:
            again = load(again_of(target), self.folder.parent.parent)[1]
        except (OSError, OutputsError):
            again = None
        try:  # used now: prune keeps a reference in use (docs/outputs.md)
            os.utime(os.path.dirname(target))
        except OSError:
            pass  # a root this job may read but not write
        out: dict[str, Any] = {"digest": digest(reference), "nonfinite": nonfinite(reference),
                               "spread": number(spread(reference, again))}
        if out["digest"] != digest(first):
            found = difference(reference, first)
            out.update(found, max_abs=number(found["max_abs"]), max_rel=number(found["max_rel"]))
        return out


@contextmanager
def collected(workload: str, shape: Any, builtin: bool, template: str | None, environ: Mapping[str, str],
              phase: str, folder: Path | None, gpu_type: str, on: bool) -> Iterator[Run]:
    """One run's outputs (see :class:`Run`): collected in the cold and validate passes where
    ``on``; a built-in workload writes them into a private temporary folder."""
    env = dict(environ, **{names.WILDCARDS_VAR: wildcards(workload, shape)})
    env.pop(names.OUTPUTS_VAR, None)
    name = slug(workload, shape)
    if not on or phase not in ("cold", "validate"):
        yield Run(env, None, None, phase, folder, name)
        return
    if not builtin:
        try:  # relative to the working folder; gpu-cache checked the template
            path = None if template is None else os.path.abspath(
                template.format_map({"shape": str(shape), "gpu_type": gpu_type}))
        except (KeyError, IndexError, ValueError):
            path = None
        why = None if path else "the workload names no usable outputs file (outputs: in its config)"
        if path:
            _forget(path)
        yield Run(env, path, why, phase, folder, name)
        return
    scratch = tempfile.mkdtemp(prefix="gpu-cache-outputs-")
    try:
        env[names.OUTPUTS_VAR] = os.path.join(scratch, "outputs.npz")
        yield Run(env, env[names.OUTPUTS_VAR], None, phase, folder, name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def served(records: Iterable[Mapping[str, Any]], workload: str, shape: Any,
           observed: Iterable[str]) -> dict[str, list[str]] | None:
    """The entries each kind served the processes of one run (their records' ``hit_keys``);
    None where no process of the run left a record (no startup hook in it)."""
    named = wildcards(workload, shape)
    out: dict[str, set[str]] = {}
    recorded = False
    for record in records:
        if record.get("wildcards") != named:
            continue
        recorded = True
        for kind in observed:
            section = record.get(kind)
            keys = section.get("hit_keys") if isinstance(section, dict) else None
            if isinstance(keys, list):
                out.setdefault(kind, set()).update(k for k in keys if isinstance(k, str))
    return {kind: sorted(keys) for kind, keys in out.items() if keys} if recorded else None
