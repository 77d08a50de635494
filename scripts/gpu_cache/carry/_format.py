"""The archive's format: the manifest, the entries it names, and what unpack accepts of them.

:func:`read_manifest` is the one gate between an archive's bytes and the code that writes:
the JSON must match :data:`SCHEMA` (types and ranges), then every
key and file name must be one that an entry of its kind can have (checked here, never left to
the tar filter: a Triton entry whose file is ``../../jax/...`` would write into another kind's
folder inside the root, where no filter looks; #19).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from functools import cache
from typing import Any

from gpu_cache.core import shown as terminal
from gpu_cache.core.caches import autotune as autotune_cache
from gpu_cache.core.caches import jax_triton as kernel_cache
from gpu_cache.core.caches import triton as triton_cache
from gpu_cache.core.errors import UsageError
from gpu_cache.core.kinds import CARRIED, KINDS

FORMAT = "gpu-cache-archive"
#: 2: every file's SHA-256 in the manifest (#21: damage that keeps sizes is found before it is
#: written); version 1 had none, so its entries cannot be checked: pack them again.
FORMAT_VERSION = 2
MANIFEST_NAME = "gpu-cache-manifest.json"
#: Largest manifest unpack reads (about 300 bytes per entry: some 200,000 entries).
MAX_MANIFEST = 64 << 20
#: Largest Triton group or metadata file read (a kernel's are a few KiB).
MAX_SMALL_JSON = 1 << 20
#: Largest file of an entry a manifest may announce, and the latest last use (seconds since
#: the epoch, some 30,000 years): beyond them a number is damage or an attack, not a cache.
MAX_FILE_BYTES = 1 << 56
LATEST = float(1 << 40)
#: A JAX entry's file names: ``<key>-cache``, ``<key>-atime`` or (older jax) ``<key>``.
_JAX_KEY_RE = re.compile(r"^[^/\x00]+-[0-9a-f]{64}$")
#: Inductor's carried entries: an FX graph or AOTAutograd key folder, or the code files of one
#: key in its shard folder (the shard: the key's second and third characters).
_INDUCTOR_KEY_RE = re.compile(r"^(fxgraph/(?P<f>[a-z0-9]{2})/f(?P=f)[a-z0-9]{30,70}"
                              r"|aotautograd/a[a-z0-9]{32,72}|(?P<c>[a-z0-9]{2})/c(?P=c)[a-z0-9]{30,70})$")
#: Inductor's entries that are key folders (the rest are code files in a shard folder).
INDUCTOR_FOLDERS = ("fxgraph/", "aotautograd/")

_TEXT = {"type": ["string", "null"]}
_TEXTS = {"type": "array", "items": {"type": "string"}}
_ENTRY = {
    "type": "object",
    "required": ["key", "files", "sha256"],
    "properties": {
        "key": {"type": "string", "minLength": 1},
        "name": _TEXT,
        "kind": _TEXT,
        "target": _TEXT,
        "tokamax": _TEXT,
        "jax": _TEXT,
        "files": {"type": "object", "minProperties": 1,
                  "additionalProperties": {"type": "integer", "minimum": 0, "maximum": MAX_FILE_BYTES}},
        "last_use": {"type": "number", "minimum": 0, "maximum": LATEST},
        "sha256": {"type": "object", "additionalProperties": {"type": "string", "pattern": "^[0-9a-f]{64}$"}},
    },
}
#: What unpack reads of a manifest (other fields are pack's report, and ignored).
SCHEMA: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "required": ["format", "format_version", "kinds"],
    "properties": {
        "format": {"const": FORMAT},
        "format_version": {"const": FORMAT_VERSION},
        "kinds": {
            "type": "object",
            "propertyNames": {"enum": list(CARRIED)},
            "additionalProperties": {"type": "object", "required": ["entries"],
                                     "properties": {"entries": {"type": "array", "items": _ENTRY}}},
        },
        "software_by_kind": {"type": "object", "additionalProperties": {"type": "array",
                                                                         "items": {"type": "object"}}},
        "device": {"type": "object", "properties": {
            kind: {"type": "object", "properties": {"gpu_types": _TEXTS, "targets": _TEXTS}}
            for kind in CARRIED}},
        "source_root": {"type": "string"},
        "jax_path_in_key": {"type": ["boolean", "null"]},
        # a stable pack (#32) keeps no times: each entry's last use is its arrival
        "times_normalised": {"type": "boolean"},
    },
}


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


def shown(name: str) -> str:
    """A name from an archive as a message shows it: escaped, and cut when long."""
    text = ascii(name)
    return text if len(text) <= 120 else text[:117] + "...'"


#: ``text`` (from an archive or a record) as one line it can be printed as (gpu_cache.core.shown).
printable = terminal.shown


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


def is_group(name: str) -> bool:
    """A Triton group file (``__grp__<kernel>.json``), whose paths unpack rewrites."""
    return name.startswith(triton_cache.GROUP_PREFIX) and name.endswith(".json")


@dataclass
class ManifestEntry:
    """One entry of an archive as its manifest names it.

    ``kind``: the cache kind (``jax``, ``triton``, ``autotune``, ``jax_triton``, ``inductor``);
    ``files``: file name -> bytes;
    ``name``: the computation, kernel or device kind; ``last_use``: seconds since the epoch;
    ``triton_kind``: Triton's ``kernel`` or ``autotune``; ``target``: the Triton target
    (``sm_90``; a jax-triton kernel's too); ``sha256``: file name -> its SHA-256;
    ``versions``: an autotuning result's (tokamax, jax) versions.
    """

    kind: str
    key: str
    files: dict[str, int]
    sha256: dict[str, str]
    last_use: float = 0.0
    name: str | None = None
    triton_kind: str | None = None
    target: str | None = None
    versions: tuple[str, str] | None = None

    @property
    def size(self) -> int:
        return sum(self.files.values())

    @property
    def ident(self) -> tuple[str, str]:
        """(kind, key): unique in an archive."""
        return self.kind, self.key

    def member(self, file_name: str) -> str:
        """The archive member that holds one of its files."""
        if self.kind == "jax":
            return f"jax/{file_name}"
        if self.kind == "autotune":  # the key is <version folder>/<file name>
            return f"autotune/{self.key.rpartition('/')[0]}/{file_name}"
        if self.kind == "inductor":  # a key folder's files, or a code entry's in its shard
            folder = self.key if self.key.startswith(INDUCTOR_FOLDERS) else self.key.rpartition("/")[0]
            return f"inductor/{folder}/{file_name}"
        if self.kind == "jax_triton":
            return f"jax_triton/{file_name}"
        return f"{self.kind}/{self.key}/{file_name}"  # a key folder (Triton's, and other kinds')

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "name": self.name, "files": self.files,
                               "sha256": self.sha256, "size": self.size, "last_use": self.last_use}
        if self.kind == "triton":
            out.update(kind=self.triton_kind, target=self.target)
        elif self.kind == "jax_triton":
            out.update(target=self.target)
        if self.versions is not None:
            out.update(tokamax=self.versions[0], jax=self.versions[1])
        return out


@cache
def _validator() -> Any:
    """The schema compiled to Python by fastjsonschema (which Snakemake's nbformat brings):
    many times faster than jsonschema on a manifest of many entries
    (tests/benchmarks/carry_scale.py measures both)."""
    import fastjsonschema

    return fastjsonschema.compile(SCHEMA)


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def parse_manifest(text: bytes) -> dict[str, Any]:
    """The manifest's JSON (``NaN`` and ``Infinity``, which Python would accept, refused).

    Raises:
        UsageError: it is not JSON.
    """
    try:
        return json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"the archive's manifest is not JSON ({shown(str(exc))}); nothing written") from None


def read_manifest(manifest: Any) -> dict[str, list[ManifestEntry]]:
    """The entries per kind of a parsed manifest, once every key and file name is shown to be
    one an entry of that kind can have.

    Raises:
        UsageError: it is not a gpu-cache manifest this version can read (the format, a
            newer version, a value of the wrong type or out of range, a name no file can have).
        Refused: it names an unsafe entry (a path in a file name, a key of another shape),
            or a member twice.
    """
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise UsageError("not a gpu-cache archive (no gpu-cache manifest first in it)")
    version = manifest.get("format_version")
    if isinstance(version, int) and version > FORMAT_VERSION:
        raise UsageError(f"the archive's format version {shown(str(version))} is newer than this "
                         f"gpu-cache reads ({FORMAT_VERSION}); update gpu-cache")
    if version == 1:
        raise UsageError("the archive was packed by an older gpu-cache, without the digests that "
                         "tell damage in transit; pack it again with this one")
    import fastjsonschema

    try:
        _validator()(manifest)
    except fastjsonschema.JsonSchemaValueException as exc:  # "data.kinds.jax... must be ..."
        where, _, rule = exc.message.partition(" must ")
        raise UsageError(f"the archive's manifest is not valid: {shown(where[5:] or '(top)')[1:-1]} must "
                         f"{shown(rule)[1:-1]}; nothing written") from None
    out: dict[str, list[ManifestEntry]] = {}
    members: set[str] = set()
    for kind, part in manifest["kinds"].items():
        out[kind] = [_entry(kind, raw, members) for raw in part["entries"]]
    return out


def _entry(kind: str, raw: dict[str, Any], members: set[str]) -> ManifestEntry:
    key, files, sha256 = raw["key"], raw["files"], raw["sha256"]
    for name in (key, *files, *sha256):
        if not file_name(name):
            raise UsageError(f"the archive's manifest names {shown(name)}, which no file can be "
                             "called; nothing written")
    if set(sha256) != set(files):
        raise UsageError(f"the archive's manifest gives the {kind} entry {shown(key)} digests of "
                         "other files than its own; nothing written")
    if kind == "jax":  # the executable, and its last use where JAX kept one
        good = bool(_JAX_KEY_RE.fullmatch(key)) and set(files) <= {f"{key}-cache", f"{key}-atime", key} \
            and bool({f"{key}-cache", key} & set(files))
    elif kind == "autotune":  # one result file in its version folder, named as the key says
        good = bool(autotune_cache.KEY_RE.fullmatch(key)) and set(files) == {key.rpartition("/")[2]}
    elif kind == "inductor":  # a key folder's plain files, or code files named by the key
        stem = key.rpartition("/")[2] + "."
        good = bool(_INDUCTOR_KEY_RE.fullmatch(key)) and (
            key.startswith(INDUCTOR_FOLDERS) or all(n.startswith(stem) for n in files))
    elif kind == "jax_triton":  # one file, named by its key
        good = bool(kernel_cache.KEY_RE.fullmatch(key)) and set(files) == {key}
    elif kind == "triton":  # a key folder of plain files; no writer's tmp. folder
        good = bool(triton_cache.KEY_RE.fullmatch(key)) and not any(n.startswith("tmp.") for n in files)
    else:  # another kind's key folder of plain files, named as the kind says
        good = plain_name(key) and KINDS[kind].carried_key(key)
    if not good or not all(plain_name(n) for n in files):
        raise Refused(f"the archive's manifest names an unsafe {kind} entry {shown(key)} (a path "
                      "in a file name, or a name an entry of that kind does not have)")
    last_use = min(float(raw.get("last_use", 0.0)), time.time())  # a future one would always win
    versions = (raw.get("tokamax"), raw.get("jax"))
    entry = ManifestEntry(kind, key, dict(files), dict(sha256), last_use, raw.get("name"),
                          raw.get("kind") if kind == "triton" else None, raw.get("target"),
                          versions if kind == "autotune" and all(versions) else None)
    for file in files:
        name = entry.member(file)
        if name in members:
            raise Refused(f"the archive's manifest names {shown(name)} twice")
        members.add(name)
    return entry
