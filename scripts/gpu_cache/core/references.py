"""The outputs proof's references: the outputs of the very compile the cache holds (issue 47,
docs/outputs.md).

A fresh compile is another executable: on a GPU it autotunes again and rounds otherwise, so
comparing with it can only be loose, and a wrong entry within the slack passes. The same
executable on the same device reproduces its outputs bit for bit (but where it is not
deterministic run to run, which two runs in one process show). So:

- **The writer keeps the reference.** After a warm pass, each run whose entries were all
  compiled by gpu-cache's warm processes (this pass's misses, or entries an earlier reference
  already names with the same bytes) keeps its outputs and its second run's (its own noise),
  with the key and a digest of every entry its processes used, in
  ``<root>/state/outputs-<fingerprint>-<environment>/<slug>.{npz,again.npz,json}``.
- **The reader must reproduce it.** Each run of the validate pass is served entries; where
  they are the reference's, byte for byte, its outputs must be the writer's: bit-identical, or
  within the writer's (and its own) run-to-run noise; else they differ and the entries are set
  aside. An entry whose bytes no warm pass compiled (the key kept, the bytes another
  executable's: a torn group, a bad promotion, a key that misses a flag) is compared too: the
  outputs must be the writer's, or that entry is set aside.
- **A reference's entries may go.** Where the reference's entries were not served (pruned,
  set aside, compiled again by a later warm, which keeps a reference of its own), the proof
  says so ("not proven") and compares nothing: outputs of other executables are no evidence.
  The next warm that compiles them keeps a new reference.
- **Carried entries bring their proof.** A pack marks each entry whose bytes a reference
  names; unpack keeps those marks as a reference without outputs (:func:`keep_carried`), so a
  warm there compiles none of them again. An entry hit that no warm compiled and no reference
  names is re-made by the warm (:mod:`gpu_cache.core.remake`).
- **The cold pass is a figure.** Where validation runs it (``validate.measure_cold``), its
  outputs (every cache off) are kept beside the reference (``<slug>.cold.npz``) and each
  validate run is compared with them: "the cached program matches a fresh compile within X",
  reported, never a failure.

Everything here is gpu-cache's own state, read by the trust rule
(:mod:`gpu_cache.core.state_files`): a reference another account may have written is no
reference. Standard library only: the workload runner runs it in the jobs' software.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpu_cache.core import kinds, output_runs, outputs, safe_io, state_files
from gpu_cache.core.kinds.integrity import files_of
from gpu_cache.core.reports import RunResult

#: A reference folder in the root's state folder: ``outputs-<fingerprint>-<environment>``.
PREFIX = "outputs-"
#: The cold pass's outputs beside a reference: ``<slug>.cold.npz``.
COLD = ".cold"
#: The environment part of the folder that keeps an unpacked archive's proof (:func:`keep_carried`).
CARRIED = "carried"
#: A manifest larger than this is none gpu-cache wrote.
MANIFEST_LIMIT = 16 << 20
VERSION = 1

Entries = dict[str, dict[str, str]]  # kind -> key -> digest of the entry's bytes


def folder_of(root: Path | None, fingerprint: str | None, environ: Mapping[str, str]) -> Path | None:
    """Where the references of these inputs (``fingerprint``: workloads, shapes, software,
    device) are kept, apart for each value of the variables that change what a compiled program
    computes (``XLA_FLAGS``, ``TRITON_DEFAULT_FP_FUSION``, ...)."""
    if root is None or not fingerprint:
        return None
    # What the kinds' pieces declare changes what their tools compile (``key-environment``);
    # where a cache is, and which of the node's GPUs the job got (``place-environment``), change
    # nothing computed (the fingerprint holds the device's model and how many are visible).
    compute = sorted({(name, environ.get(name)) for kind in kinds.ALL for name in kind.piece.key_environment})
    tail = hashlib.sha256(repr(compute).encode()).hexdigest()[:12]
    return state_files.folder(root) / f"{PREFIX}{fingerprint}-{tail}"


# --- the entries: which were used, and their bytes --------------------------------------------


def entry_digest(kind: kinds.Kind, entry: kinds.Entry) -> str:
    """A digest of the bytes of one entry (every file of it, by its place in the entry; files
    the tool rewrites on each use, as JAX's ``-atime``, left out)."""
    total = hashlib.sha256()
    for top in kind.files(entry):
        for path, info in sorted(files_of(top)):
            if kind.volatile(os.path.basename(path)):
                continue
            total.update(f"{os.path.relpath(path, top)}\0{info.st_size}\0".encode())
            for chunk in safe_io.iter_chunks(path):
                total.update(chunk)
    return total.hexdigest()[:32]


def digests(root: Path, tier: Path | None, wanted: Mapping[str, Iterable[str]]) -> Entries:
    """The digest of each entry of ``wanted`` (kind -> keys, as the startup hook's records name
    them) that the cache holds whole: its node-local tier's copy where there is one (what this
    node's processes were served), else the root's. An entry it does not hold is left out."""
    out: Entries = {}
    for name, keys in wanted.items():
        wanted_keys, found = set(keys), out.setdefault(name, {})
        kind = kinds.KINDS.get(name)
        if kind is None or not wanted_keys:
            continue
        for top in (tier, root) if tier is not None and kind.tiered else (root,):
            try:
                entries = kind.scan(kind.folder(top), grace_seconds=0.0)
            except (OSError, ValueError):
                continue  # an unusable folder: its entries count as not held
            for entry in entries:
                key = entry.key if entry.key in wanted_keys else entry.key.rsplit("/", 1)[-1]
                if key in wanted_keys and key not in found and entry.problem is None:
                    try:
                        found[key] = entry_digest(kind, entry)
                    except OSError:
                        continue
    return out


def _pick(entries: Entries, keys: Mapping[str, Iterable[str]]) -> Entries:
    return {kind: {key: entries[kind][key] for key in found if key in entries.get(kind, {})}
            for kind, found in keys.items()}


# --- the manifests: what a reference holds ------------------------------------------------------


def manifest(folder: Path, name: str, root: Path) -> dict[str, Any] | None:
    """The manifest of the reference ``name`` in ``folder`` (None: none, or none gpu-cache wrote).

    Raises:
        state_files.Untrusted: another account may have written it.
    """
    try:
        found = json.loads(state_files.read(folder / f"{name}.json", root, MANIFEST_LIMIT))
    except state_files.Untrusted:
        raise
    except (OSError, ValueError, RecursionError):
        return None
    if not (isinstance(found, dict) and found.get("version") == VERSION
            and isinstance(found.get("digest"), str) and isinstance(found.get("file"), str)
            and isinstance(found.get("entries"), dict) and isinstance(found.get("spreads"), dict)
            and all(isinstance(keys, dict) and all(isinstance(d, str) for d in keys.values())
                    for keys in found["entries"].values())):
        return None
    return found


def manifests(root: Path) -> Iterable[tuple[Path, dict[str, Any]]]:
    """Every trusted manifest of the root's references, with its folder."""
    for name, path, info in safe_io.listing(state_files.folder(root)):
        if not (name.startswith(PREFIX) and stat.S_ISDIR(info.st_mode)):
            continue
        for file, _path, file_info in safe_io.listing(path):
            if file.endswith(".json") and stat.S_ISREG(file_info.st_mode):
                try:
                    found = manifest(Path(path), file[:-len(".json")], root)
                except state_files.Untrusted:
                    continue
                if found is not None:
                    yield Path(path), found


def proven(root: Path) -> dict[tuple[str, str], set[str]]:
    """The bytes (digests) of each entry that a warm process compiled, as the root's references
    name them."""
    out: dict[tuple[str, str], set[str]] = {}
    for _folder, found in manifests(root):
        for kind, keys in found["entries"].items():
            for key, value in keys.items():
                out.setdefault((kind, key), set()).add(value)
    return out


def compiled_by_warm(known: Mapping[tuple[str, str], set[str]], kind: str, key: str,
                     digest: str | None) -> bool:
    """Whether ``digest``, of the entry ``key`` of ``kind``, is bytes a warm process compiled, as
    the references ``known`` (:func:`proven`) name them: by the key, or its last part (as the
    records name Inductor's graphs)."""
    return digest is not None and any(digest in known.get((kind, name), ()) for name in _names(key))


def _names(key: str) -> set[str]:
    return {key, key.rsplit("/", 1)[-1]}


def keep_carried(root: Path, source: str, name: str, entries: Entries) -> None:
    """Keep what an unpacked archive says of the entries it wrote here (``entries``: their
    digests here): a warm process compiled their bytes, as the packed root's references named
    them. A reference without outputs, ``state/outputs-<source>-carried/carried.json``
    (``source``: 24 hex digits that name the archive, whose ``name`` it keeps), to which a later
    unpack of the same archive adds: a warm that hits them compiles none again and keeps its own
    reference (docs/outputs.md); prune takes it as any reference, once unused longer than
    ``max_age``.

    Raises:
        OSError: it cannot be kept (state_files.Untrusted: another account's state folder).
    """
    folder = state_files.make(root, f"{PREFIX}{source}-{CARRIED}")
    try:
        before = manifest(folder, CARRIED, root) or {}
    except state_files.Untrusted:
        before = {}
    named = {kind: dict(keys) for kind, keys in before.get("entries", {}).items()}
    for kind, keys in entries.items():
        for key, value in keys.items():
            named.setdefault(kind, {}).update(dict.fromkeys(_names(key), value))
    document = {"version": VERSION, "workload": f"(carried) {name}", "shape": source, "gpu_type": "(carried)",
                "file": "", "digest": "", "spreads": {}, "entries": _nonempty(named), "time": time.time(),
                "host": socket.gethostname()}
    safe_io.replace_file(folder / f"{CARRIED}.json", (json.dumps(document, sort_keys=True) + "\n").encode())


def _arrays(path: Path, root: Path | None = None) -> dict[str, outputs.Array] | None:
    try:
        return outputs.load(str(path), root)[1]
    except (OSError, outputs.OutputsError):
        return None


def _spreads(found: Mapping[str, Any]) -> dict[str, float]:
    return {str(k): v for k, v in ((k, outputs.figure(v)) for k, v in found.items()) if v is not None}


# --- the passes --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pass:
    """Where one pass keeps and finds references: the root, this node's tier, the references'
    folder of its inputs, the scratch folder its runs' outputs were copied to."""

    phase: str
    gpu_type: str
    root: Path
    tier: Path | None
    folder: Path
    scratch: Path


def settle(where: Pass, runs: list[RunResult], records: list[dict[str, Any]]) -> list[RunResult]:
    """Once a pass's runs have ended and their records are in: the cold pass keeps its outputs
    beside the references (the fresh compile's figure), the warm pass keeps the writers'
    references, and the validate pass compares with them. Each run's report gains
    ``reference``."""
    if where.phase == "cold":
        return [replace(run, outputs={**run.outputs, "kept": _keep_cold(where, run)})
                if _reported(run) else run for run in runs]
    uses = {i: output_runs.used(records, run.workload, run.shape, kinds.names_of(kinds.OBSERVED))
            for i, run in enumerate(runs) if _reported(run)}
    wanted: dict[str, set[str]] = {}
    for found in uses.values():
        for part in found or ():
            for kind, keys in part.items():
                wanted.setdefault(kind, set()).update(keys)
    now = digests(where.root, where.tier, wanted)
    known = proven(where.root)
    if where.phase == "warm":  # what this pass's processes compiled is a warm compile too
        for found in uses.values():
            for kind, keys in _pick(now, found[1] if found else {}).items():
                for key, value in keys.items():
                    known.setdefault((kind, key), set()).add(value)
    out = []
    for i, run in enumerate(runs):
        if i in uses:
            judge = _keep_writer if where.phase == "warm" else _compare
            run = replace(run, outputs={**run.outputs, "served": uses[i][0] if uses[i] else None,
                                        "reference": judge(where, run, uses[i], now, known)})
        out.append(run)
    return out


def _reported(run: RunResult) -> bool:
    return run.outputs is not None and "kept" in run.outputs and not run.outputs.get("error")


def _keep_cold(where: Pass, run: RunResult) -> bool:
    """Keep the cold pass's outputs (a fresh compile's) beside the references."""
    kept = str(run.outputs["kept"]) if run.outputs else ""
    stem, suffix = os.path.splitext(kept)
    try:
        state_files.make(where.root, where.folder.name)
        safe_io.replace_file(where.folder / f"{stem}{COLD}{suffix}", (where.scratch / kept).read_bytes())
    except OSError:
        return False  # an unusable root, or another account's state folder: no figure then
    return True


def cold_kept(folder: Path | None, runs: Iterable[RunResult]) -> bool:
    """Whether the outputs of an earlier cold pass's ``runs`` are all kept in ``folder``."""
    for run in runs:
        found = run.outputs
        if found is None:
            return False  # measured before outputs were collected
        if "error" in found:
            continue
        suffix = os.path.splitext(str(found.get("file")))[1]
        name = f"{output_runs.slug(run.workload, run.shape)}{COLD}{suffix}"
        if folder is None or not (folder / name).is_file():
            return False
    return True


def _unproven(entries: Entries, known: Mapping[tuple[str, str], set[str]]) -> list[str]:
    """The entries of ``entries`` whose bytes no warm process compiled."""
    return [f"{kind} {key}" for kind, keys in sorted(_unproven_keys(entries, known).items()) for key in keys]


def _unproven_keys(entries: Entries, known: Mapping[tuple[str, str], set[str]]) -> dict[str, list[str]]:
    """The keys of ``entries`` whose bytes no warm process compiled, by kind: what the warm pass
    re-makes (:mod:`gpu_cache.core.remake`)."""
    found = {kind: sorted(key for key, value in keys.items() if value not in known.get((kind, key), ()))
             for kind, keys in entries.items()}
    return {kind: keys for kind, keys in sorted(found.items()) if keys}


def _keep_writer(where: Pass, run: RunResult, used: tuple[dict, dict] | None, now: Entries,
                 known: Mapping[tuple[str, str], set[str]]) -> dict[str, Any]:
    """Keep the run's outputs as its shape's reference where the entries its processes used
    are all a warm compile's (``known``: this pass's processes compiled them, or an earlier
    reference names them with the same bytes)."""
    if used is None:
        return {"kept": False, "why": "its processes left no record of the entries they used (no startup "
                                      "hook in them, or more entries than a record keeps)"}
    hits, misses = used
    entries = _pick(now, {kind: [*hits.get(kind, []), *misses.get(kind, [])] for kind in {*hits, *misses}})
    unproven = _unproven(entries, known)
    if unproven:
        more = f" and {len(unproven) - 3} more" if len(unproven) > 3 else ""
        return {"kept": False, "why": f"it was served {', '.join(unproven[:3])}{more}, which no warm pass "
                                      "compiled: outputs of those prove nothing",
                "remake": _unproven_keys(entries, known)}
    name = output_runs.slug(run.workload, run.shape)
    try:
        before = manifest(where.folder, name, where.root)
    except state_files.Untrusted:
        before = None
    if not any(misses.values()) and before is not None and before["entries"] == _nonempty(entries):
        return {"kept": False, "why": "the reference kept before names the same entries"}
    try:
        _write(where, run, name, entries)
    except OSError as exc:
        return {"kept": False, "why": f"it cannot be kept: {exc}"}
    return {"kept": True, "entries": sum(len(keys) for keys in entries.values())}


def _nonempty(entries: Entries) -> Entries:
    return {kind: keys for kind, keys in entries.items() if keys}


def _write(where: Pass, run: RunResult, name: str, entries: Entries) -> None:
    """Write a reference: its outputs, its second run's, then its manifest (a reader that finds
    the manifest finds the outputs it names; their digest says which).

    Raises:
        OSError: it cannot be written (state_files.Untrusted: another account's state folder).
    """
    assert run.outputs is not None
    kept = str(run.outputs["kept"])
    stem, suffix = os.path.splitext(kept)
    first = outputs.load(str(where.scratch / kept))[1]
    again_file = where.scratch / outputs.again_of(kept)
    again = _arrays(again_file)
    folder = state_files.make(where.root, where.folder.name)
    safe_io.replace_file(folder / kept, (where.scratch / kept).read_bytes())
    if again is not None:
        safe_io.replace_file(folder / outputs.again_of(kept), again_file.read_bytes())
    elif os.path.lexists(folder / outputs.again_of(kept)):
        os.unlink(folder / outputs.again_of(kept))
    spreads = outputs.spreads(first, again) or {}
    document = {"version": VERSION, "workload": run.workload, "shape": str(run.shape),
                "gpu_type": where.gpu_type, "file": suffix, "digest": outputs.digest(first),
                "spreads": {k: outputs.number(v) for k, v in spreads.items()},
                "entries": _nonempty(entries), "time": time.time(), "host": socket.gethostname()}
    safe_io.replace_file(folder / f"{stem}.json", (json.dumps(document, sort_keys=True) + "\n").encode())


def _entries_state(reference: Entries, served: Entries, known: Mapping[tuple[str, str], set[str]]
                   ) -> tuple[str, str | None, dict[str, list[str]]]:
    """Whether a run was served the reference's entries: ("same", None, {}), ("changed", None,
    suspects: entries whose bytes no warm compiled, under the reference's keys), or ("gone",
    why, {}): entries of the reference not served (pruned, set aside, compiled again), or
    served entries it does not name."""
    ref = {(kind, key): value for kind, keys in reference.items() for key, value in keys.items()}
    got = {(kind, key): value for kind, keys in served.items() for key, value in keys.items()}
    changed = sorted(item for item in ref.keys() & got.keys() if ref[item] != got[item])
    suspects: dict[str, list[str]] = {}
    for kind, key in changed:
        if got[(kind, key)] not in known.get((kind, key), ()):
            suspects.setdefault(kind, []).append(key)
    if suspects:
        return "changed", None, suspects
    gone, extra = sorted(ref.keys() - got.keys()), sorted(got.keys() - ref.keys())
    if not (gone or extra or changed):
        return "same", None, {}
    parts = [f"{len(gone)} of its {len(ref)} entries were not served (pruned, set aside or compiled "
             f"again: {gone[0][0]} {gone[0][1]})" if gone else "",
             f"{len(changed)} were compiled again since ({changed[0][0]} {changed[0][1]})" if changed else "",
             f"{len(extra)} entries it does not name were served ({extra[0][0]} {extra[0][1]})"
             if extra else ""]
    return "gone", "the reference's entries are gone: " + "; ".join(p for p in parts if p) + \
        "; the next warm that compiles them keeps a new reference", {}


def _compare(where: Pass, run: RunResult, used: tuple[dict, dict] | None, now: Entries,
             known: Mapping[tuple[str, str], set[str]]) -> dict[str, Any]:
    """How the run's outputs compare with its shape's reference: which entries it was served
    (``entries``: same, changed, gone, none), the figures (``max_abs``, ``max_rel``, ``noise``,
    ``within_noise``, ...), and the fresh compile's figure where the cold pass kept one."""
    assert run.outputs is not None
    name = output_runs.slug(run.workload, run.shape)
    try:
        found = manifest(where.folder, name, where.root)
    except state_files.Untrusted as exc:
        return {"untrusted": str(exc)}
    kept = str(run.outputs["kept"])
    first = _arrays(where.scratch / kept)
    out: dict[str, Any] = {"fresh_compile": _fresh(where, name, kept, first)}
    if used is None:  # (a warm's runs leave none either: no warm would keep a reference)
        return {**out, "entries": "none",
                "why": "its processes left no record of the entries they were served"}
    if first is None:
        return {**out, "entries": "none", "why": "its outputs cannot be read back"}
    if found is None:  # the next warm re-makes what no warm compiled, and keeps the reference
        return {**out, "entries": "none", "next_warm_proves": True,
                "why": "no warm pass kept this shape's outputs from the very compile the cache holds (the "
                       "next warm compiles its entries again and keeps them)"}
    state, why, suspects = _entries_state(found["entries"], _pick(now, used[0]), known)
    if why is not None:
        return {**out, "entries": state, "why": why, "next_warm_proves": True}
    try:
        reference = outputs.load(str(where.folder / f"{name}{found['file']}"), where.root)[1]
    except state_files.Untrusted as exc:
        return {"untrusted": str(exc)}
    except (OSError, outputs.OutputsError):
        reference = None
    if reference is None or outputs.digest(reference) != found["digest"]:
        return {**out, "entries": "none", "why": "its reference's outputs are gone or being replaced"}
    try:  # used now: prune keeps a reference in use (docs/outputs.md)
        os.utime(where.folder)
    except OSError:
        pass  # a root this job may read but not write
    own = outputs.spreads(first, _arrays(where.scratch / outputs.again_of(kept)))
    noise = outputs.noise_of(_spreads(found["spreads"]), own)
    out.update(entries=state, suspects=suspects, digest=found["digest"],
               spread=outputs.number(max(_spreads(found["spreads"]).values(), default=0.0)),
               noise=outputs.number(max(noise.values(), default=0.0)),
               **outputs.compared(reference, first, noise))
    return out


def _fresh(where: Pass, name: str, kept: str, first: dict[str, outputs.Array] | None
           ) -> dict[str, Any] | None:
    """How the run's outputs compare with a fresh compile's (the cold pass's, where kept): a
    figure, never a verdict."""
    suffix = os.path.splitext(kept)[1]
    cold = _arrays(where.folder / f"{name}{COLD}{suffix}", where.root)
    if cold is None or first is None:
        return None
    if outputs.digest(cold) == outputs.digest(first):
        return {"identical": True}
    found = outputs.compared(cold, first, {})
    return {"identical": False, **{k: found[k] for k in ("max_abs", "max_rel", "mismatch", "new_nonfinite")}}


# --- pruning: the references kept, by inputs -----------------------------------------------------


@dataclass(frozen=True)
class Reference:
    """A folder of references (:func:`folder_of`): its name, the fingerprint of its inputs, its
    bytes, when a pass last kept or compared with it (its newest mtime), and the GPU type,
    workloads and shapes its manifests name (None: none)."""

    name: str
    fingerprint: str
    size: int
    last_use: float
    inputs: tuple[str, tuple[tuple[str, str], ...]] | None


def listed(root: Path) -> list[Reference]:
    """The reference folders of the root (folders only: a link is none gpu-cache made)."""
    found = []
    for name, path, info in safe_io.listing(state_files.folder(root)):
        parts = name[len(PREFIX):].split("-")
        if name.startswith(PREFIX) and len(parts) == 2 and stat.S_ISDIR(info.st_mode):
            size, _files, newest = safe_io.tree_size(path)
            last_use = max(info.st_mtime, newest)
            found.append(Reference(name, parts[0], size, last_use, _inputs(Path(path), root)))
    return found


def _inputs(folder: Path, root: Path) -> tuple[str, tuple[tuple[str, str], ...]] | None:
    runs, types = [], set()
    for file, _path, _info in safe_io.listing(folder):
        try:
            found = manifest(folder, file[:-len(".json")], root) if file.endswith(".json") else None
        except state_files.Untrusted:
            found = None
        if found is not None:
            types.add(str(found.get("gpu_type")))
            runs.append((str(found.get("workload")), str(found.get("shape"))))
    return (types.pop(), tuple(sorted(runs))) if len(types) == 1 else None
