"""The archive's format: the manifest, the entries it names, and what unpack accepts of them.

:func:`read_manifest` is the one gate between an archive's bytes and the code that writes:
the JSON must match :data:`SCHEMA` (types and ranges), then every
key and file name must be one that an entry of its kind can have (checked here, never left to
the tar filter: a Triton entry whose file is ``../../jax/...`` would write into another kind's
folder inside the root, where no filter looks; #19).
"""

from __future__ import annotations

import json
import time
from functools import cache
from typing import Any

from gpu_cache.core import kinds
from gpu_cache.core import shown as terminal
from gpu_cache.core.errors import UsageError
from gpu_cache.core.kinds.carrying import ManifestEntry, Refused, file_name, plain_name, shown

FORMAT = "gpu-cache-archive"
#: 2: every file's SHA-256 in the manifest (#21: damage that keeps sizes is found before it is
#: written); version 1 had none, so its entries cannot be checked: pack them again.
FORMAT_VERSION = 2
MANIFEST_NAME = "gpu-cache-manifest.json"
#: Largest manifest unpack reads (about 300 bytes per entry: some 200,000 entries).
MAX_MANIFEST = 64 << 20
#: Largest file of an entry a manifest may announce, and the latest last use (seconds since
#: the epoch, some 30,000 years): beyond them a number is damage or an attack, not a cache.
MAX_FILE_BYTES = 1 << 56
LATEST = float(1 << 40)
_TEXT = {"type": ["string", "null"]}
_TEXTS = {"type": "array", "items": {"type": "string"}}
_ENTRY = {
    "type": "object",
    "required": ["key", "files", "sha256"],
    "properties": {
        "key": {"type": "string", "minLength": 1},
        "name": _TEXT,
        **{name: _TEXT for kind in kinds.CARRIED for name in kind.carry.fields},
        "files": {"type": "object", "minProperties": 1,
                  "additionalProperties": {"type": "integer", "minimum": 0, "maximum": MAX_FILE_BYTES}},
        "last_use": {"type": "number", "minimum": 0, "maximum": LATEST},
        "sha256": {"type": "object", "additionalProperties": {"type": "string", "pattern": "^[0-9a-f]{64}$"}},
        "warm": {"type": "boolean"},
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
            "propertyNames": {"enum": kinds.names_of(kinds.CARRIED)},
            "additionalProperties": {"type": "object", "required": ["entries"],
                                     "properties": {"entries": {"type": "array", "items": _ENTRY},
                                                    "path_in_key": {"type": ["boolean", "null"]}}},
        },
        "software_by_kind": {"type": "object", "additionalProperties": {"type": "array",
                                                                         "items": {"type": "object"}}},
        "device": {"type": "object", "properties": {
            kind.name: {"type": "object", "properties": {"gpu_types": _TEXTS, "targets": _TEXTS}}
            for kind in kinds.CARRIED}},
        "source_root": {"type": "string"},
        # a stable pack (#32) keeps no times: each entry's last use is its arrival
        "times_normalised": {"type": "boolean"},
    },
}


#: ``text`` (from an archive or a record) as one line it can be printed as (gpu_cache.core.shown).
printable = terminal.shown


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


def _entry(name: str, raw: dict[str, Any], members: set[str]) -> ManifestEntry:
    kind = kinds.named(name)  # (a carried kind: the schema says so)
    key, files, sha256 = raw["key"], raw["files"], raw["sha256"]
    for text in (key, *files, *sha256):
        if not file_name(text):
            raise UsageError(f"the archive's manifest names {shown(text)}, which no file can be "
                             "called; nothing written")
    if set(sha256) != set(files):
        raise UsageError(f"the archive's manifest gives the {name} entry {shown(key)} digests of "
                         "other files than its own; nothing written")
    if not kind.carry.names_ok(key, files) or not all(plain_name(n) for n in files):
        raise Refused(f"the archive's manifest names an unsafe {name} entry {shown(key)} (a path "
                      "in a file name, or a name an entry of that kind does not have)")
    last_use = min(float(raw.get("last_use", 0.0)), time.time())  # a future one would always win
    entry = ManifestEntry(kind, key, dict(files), dict(sha256), last_use, raw.get("name"),
                          {field: raw.get(field) for field in kind.carry.fields}, raw.get("warm") is True)
    for file in files:
        member = entry.member(file)
        if member in members:
            raise Refused(f"the archive's manifest names {shown(member)} twice")
        members.add(member)
    return entry
