"""torch's JIT-built C++/CUDA extensions as a kind (``TORCH_EXTENSIONS_DIR``, issue 38):
``torch.utils.cpp_extension.load()`` and ``load_inline()`` build with ninja into
``<folder>/<name>``. The startup hook's piece (``_hook/gpu_cache_hook/kinds/torch_extensions/``)
keys each build by what changes the code it makes (the extension's name, the sources' contents,
the flags and the response files they name, torch's build, the compiler and its search paths,
Python's ABI and CUDA's targets), builds it with single-flight in a temporary folder only the
job's user can write (never torch's own ``<folder>/<name>``), and renames it into place whole as
``<folder>/<name>-<key>``: the library, the ninja file and the manifest (:data:`MANIFEST`,
written last) that names its key parts, the library's size and digest, and the headers it
included.

One entry per name at the top of the folder: a keyed build (whole when its manifest names its
key and its library is there at the size built), a folder torch made itself (``load_inline``'s
sources, or a build made without the hook: broken where torch's ``FileBaton`` ``lock`` was left
older than the grace period, on which every later job without the hook would wait for ever),
a temporary build older than the grace period (its builder was killed: broken), the trash's
leftovers, or any other name.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from gpu_cache._hook.gpu_cache_hook.builds import KEY_LENGTH, MANIFEST, MANIFEST_LIMIT
from gpu_cache.core import names, safe_io
from gpu_cache.core.kinds import layouts, triton_carry
from gpu_cache.core.kinds.carrying import Carried, Carry, ManifestEntry, Writer, plain_name, regular_files
from gpu_cache.core.kinds.explaining import AgainstEntries, compared
from gpu_cache.core.kinds.kind import Entry, Kind, ReadOnlyUse
from gpu_cache.core.verified import Record

#: A keyed build's folder name (the hook's keyed build folders, whose manifest, ``MANIFEST``,
#: this imports): the extension's name (torch's, with ``_v<n>`` for a later version in one
#: process) and the hex digits of its key.
KEYED = re.compile(rf"^(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)-(?P<key>[0-9a-f]{{{KEY_LENGTH}}})$")
#: torch's ``FileBaton`` lock file in a build folder of its own.
BATON = "lock"
#: What each key part means, as the first words of a cause (``doctor --explain``).
PART_HINTS = {
    "sources": "its sources changed (another version of the code, or of what load_inline is given)",
    "flags": "its flags or options changed (extra_cflags, extra_ldflags, include paths, with_cuda)",
    "responses": "a response file its flags name changed (@file, nvcc's --options-file)",
    "torch": "another torch build loaded it",
    "compiler": "another C++ compiler builds it (CXX, PATH, or the compiler's release)",
    "paths": "the compiler searches other folders (CPATH, CPLUS_INCLUDE_PATH, LIBRARY_PATH, ...: another "
             "version of a library it includes or links)",
    "python": "another Python ABI, or another machine, loaded it",
    "native": "it is built for the CPU it runs on (-march=native), and this CPU is another kind",
    "cuda": "other CUDA targets (TORCH_CUDA_ARCH_LIST, the GPUs visible, CUDA_HOME, CC)",
}


class _TorchExtensions(Kind):
    name = "torch_extensions"
    env_var = names.TORCH_EXTENSIONS_DIR_VAR
    read_only = ReadOnlyUse.FALLBACK
    sealed = True
    last_use = ("the newest modification time of the entry's folder (which the startup hook sets on "
                "every hit) and of its files")

    def _entries(self, folder: Path, grace_seconds: float, verify_after: float | None,
                 record: Record | None) -> list[Entry]:
        out = []
        for name, path, info in safe_io.listing(folder):
            if name == safe_io.TRASH_DIR_NAME and stat.S_ISDIR(info.st_mode):
                out += [self._entry(f"{name}/{left}", "(trash)", p, i, "left over from an interrupted "
                                    "removal") for left, p, i in safe_io.listing(path)]
            elif name.startswith(names.TEMP_PREFIX):
                entry = self._entry(name, "(temporary)", path, info,
                                    "a build that never finished (its builder was killed?)")
                if entry.last_use < time.time() - grace_seconds:  # younger: a build under way
                    out.append(entry)
            elif (keyed := KEYED.fullmatch(name)) and stat.S_ISDIR(info.st_mode):
                out.append(self._entry(name, keyed["name"], path, info, _broken(path, keyed["key"])))
            elif stat.S_ISDIR(info.st_mode):
                out.append(self._entry(name, f"torch's own folder of {name}", path, info,
                                       _baton_left(path, grace_seconds)))
            else:
                out.append(self._entry(name, "(other)", path, info, None))
        return out

    def inner(self, folder: Path) -> list[Path]:
        """torch's own folders of a name at its top, judged as kind folders: a job without the
        startup hook builds there (``load_inline`` writes its sources there, so whoever may add
        to one decides what it compiles). Not the keyed builds (the hook checks each before it
        loads it, and env runs at every job's start), nor gpu-cache's temporary and trash folders."""
        return [path for path in sorted(folder.glob("*")) if not KEYED.fullmatch(path.name)
                and not path.name.startswith((names.TEMP_PREFIX, safe_io.TRASH_DIR_NAME))]

    def _entry(self, key: str, name: str, path: str, info: os.stat_result, problem: str | None) -> Entry:
        if not stat.S_ISDIR(info.st_mode):
            return Entry(self, key, name, info.st_size, info.st_mtime, problem, None, path=path)
        size, _files, newest = safe_io.tree_size(path)
        return Entry(self, key, name, size, max(newest, info.st_mtime), problem, None, path=path)

    def _remove(self, folder: Path, entry: Entry) -> None:
        """A folder renamed into the trash first (a process that loaded its library keeps what
        it mapped), then deleted; any other name unlinked, never followed."""
        assert entry.path is not None
        layouts.remove_named(folder, entry.key, entry.path)

    def present(self, folder: Path, key: str) -> bool:
        return (folder / key / MANIFEST).is_file()

    def compiled(self, keys: list[str]) -> list[str]:
        """Its keyed builds (torch's own folders hold sources, or builds made without the hook)."""
        return [key for key in keys if KEYED.fullmatch(key)]

    def missed_name(self, key: str) -> str:
        return key.rpartition("-")[0] or key


def _manifest(path: str) -> dict[str, Any]:
    data = json.loads(safe_io.read_bounded(os.path.join(path, MANIFEST), MANIFEST_LIMIT))
    if not isinstance(data, dict):
        raise ValueError("not a mapping")
    return data


def _broken(path: str, key: str) -> str | None:
    """Why the keyed build in ``path`` is not whole, or None."""
    try:
        manifest = _manifest(path)
    except FileNotFoundError:
        return "no manifest: not a whole build"
    except (OSError, ValueError, RecursionError) as exc:
        return f"its manifest is unreadable ({exc.__class__.__name__})"
    library = manifest.get("library")
    if manifest.get("key") != key or not isinstance(library, str) or os.path.basename(library) != library \
            or library in ("", ".", ".."):
        return "its manifest is not its key's"
    try:
        info = os.lstat(os.path.join(path, library))
    except OSError:
        return f"its library {library} is missing"
    if not stat.S_ISREG(info.st_mode) or info.st_size != manifest.get("size"):
        return f"its library {library} is not as built"
    return None


def _baton_left(path: str, grace_seconds: float) -> str | None:
    """Why torch's own build folder ``path`` is broken: a ``FileBaton`` lock left by a builder
    older than the grace period (every later job without the hook waits on it for ever)."""
    try:
        info = os.lstat(os.path.join(path, BATON))
    except OSError:
        return None
    if info.st_mtime < time.time() - grace_seconds:
        return "torch's FileBaton lock left by a build that never finished (jobs would wait on it for ever)"
    return None


def _ended(record: dict[str, Any]) -> float:
    when = record.get("time")
    return float(when) if isinstance(when, (int, float)) else float("inf")


class _Builds:
    """The cache's keyed builds, read once: their key parts and when each was built (its
    manifest's mtime), by extension name."""

    def __init__(self, folder: Path | None) -> None:
        self.by_name: dict[str, list[tuple[str, float, dict[str, Any]]]] = {}
        for name, path, info in safe_io.listing(folder) if folder is not None else []:
            keyed = KEYED.fullmatch(name)
            if not keyed or not stat.S_ISDIR(info.st_mode) or _broken(path, keyed["key"]):
                continue
            parts = _manifest(path).get("parts")
            if isinstance(parts, dict):
                built = os.lstat(os.path.join(path, MANIFEST)).st_mtime
                self.by_name.setdefault(keyed["name"], []).append((name, built, parts))

    def explain(self, item: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
        """One missed build (an item of ``record``) against the other builds of its name made
        before its process ended, shaped like a JAX key's explanation."""
        before = _ended(record)
        parts = item.get("parts") if isinstance(item.get("parts"), dict) else {}
        name, key = str(item.get("name") or "?"), str(item.get("key") or "")
        out: dict[str, Any] = {"name": name, "key": key, "compared_with": None, "changed": [], "causes": []}
        why = item.get("why")
        if isinstance(why, str) and why != "no entry":
            out["causes"].append(f"its build was there but not served: {why}")
            return out
        same = [p for other, built, p in self.by_name.get(name, []) if other != key and built < before]
        if not same:
            out["causes"].append(f"no build of {name} was in the cache: a first build here (did the "
                                 "warm-up workload load it?)")
            return out
        out["changed"], causes = compared(parts, same, PART_HINTS)
        out["causes"] += causes
        return out


class _BuildsCarry(Carry):
    """Its builds are key folders of plain files, written as Triton's are (built beside, renamed
    in)."""

    device = None  # the CUDA targets are in the key

    def entries(self, folder: Path, wanted: set[str] | None) -> list[Carried]:
        def files(path: Path) -> dict[str, Path]:  # listed when broken too: pack's read rule judges them
            return regular_files(path) if path.is_dir() and not path.is_symlink() else {}

        return [Carried(e.key, e.name, files(Path(e.path)), e.last_use, e.problem)
                for e in self.kind.scan(folder, grace_seconds=3600.0)
                if KEYED.fullmatch(e.key) and (wanted is None or e.key in wanted)]

    def folder(self, key: str) -> str:
        return key

    def names_ok(self, key: str, files: Collection[str]) -> bool:
        return KEYED.fullmatch(key) is not None and all(plain_name(name) for name in files)

    def writers(self, folder: Path, dir_fd: int) -> Callable[[ManifestEntry, bool], Writer]:
        return triton_carry.writers(folder, dir_fd)


class _BuildsExplain(AgainstEntries):
    """Each missed build against the cache's builds of the same name."""

    missed_words = "torch extensions built in the process (one by one below)"
    entries = _Builds


KIND = _TorchExtensions(carry=_BuildsCarry, explain=_BuildsExplain)
