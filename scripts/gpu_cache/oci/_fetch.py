"""``gpu-cache fetch``: one GPU type's pack from a registry, every digest checked on the way
into a private temporary folder, then unpack's own checks on every layer (a dry run) before
any entry is written through unpack's safe path."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_cache.config.units import format_size
from gpu_cache.core.errors import UsageError
from gpu_cache.core.kinds import CARRIED, named, names_of
from gpu_cache.core.owners import Team

from ._client import DIGEST_RE, INDEX_TYPE, MANIFEST_TYPE, Reference, Session
from ._common import (
    ARTIFACT_TYPE,
    CONFIG_FORMAT,
    CONFIG_TYPE,
    CONFIG_VERSION,
    GPU_TYPE_KEY,
    KIND_KEY,
    LAYER_TYPE,
    MAX_CONFIG,
    Refused,
    log,
)


@dataclass
class FetchReport:
    reference: str
    digest: str  # what the reference named when it was read: pin this one
    gpu_type: str
    manifest: str  # the GPU type's artifact
    bytes: int = 0
    unpacked: dict[str, dict[str, Any]] = field(default_factory=dict)  # kind -> unpack's report
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "fetched": True,
            "reference": self.reference,
            "digest": self.digest,
            "gpu_type": self.gpu_type,
            "manifest": self.manifest,
            "bytes": self.bytes,
            "unpacked": self.unpacked,
            "notes": self.notes,
        }


def render_fetch(report: FetchReport, name: str) -> str:
    parts = [
        f"{kind}: {u['written'].get(kind, 0)} new, {u['replaced'].get(kind, 0)} replaced, "
        f"{u['kept_newer'].get(kind, 0)} kept"
        for kind, u in report.unpacked.items()
    ]
    return (
        f"fetched {name}@{report.digest} (from {report.reference}), GPU type {report.gpu_type}: "
        f"{report.manifest}, {format_size(report.bytes)}; {'; '.join(parts)}\n"
    )


def parse_json(raw: bytes, what: str) -> dict[str, Any]:
    try:
        document = json.loads(raw)
    except ValueError:
        document = None
    if not isinstance(document, dict):
        raise Refused(f"{what} is not a JSON object")
    return document


def _media_type(document: Mapping[str, Any]) -> str:
    value = document.get("mediaType")
    return value if isinstance(value, str) else ""


def _descriptor(value: Any, what: str, media_type: str) -> dict[str, Any]:
    """A descriptor as gpu-cache writes them: its media type, digest and size checked."""
    if (
        not isinstance(value, dict)
        or value.get("mediaType") != media_type
        or not isinstance(value.get("digest"), str)
        or not DIGEST_RE.fullmatch(value["digest"])
        or not isinstance(value.get("size"), int)
        or value["size"] < 0
    ):
        raise Refused(f"{what} is not a gpu-cache descriptor ({media_type}, a sha256 digest, a size)")
    return value


def choose(index: Mapping[str, Any], gpu_type: str, reference: Reference) -> dict[str, Any]:
    """The index entry of ``gpu_type``.

    Raises:
        Refused: the index has none (it names the GPU types it has).
    """
    entries = index.get("manifests")
    if not isinstance(entries, list):
        raise Refused(f"{reference} is not a gpu-cache index (no manifests)")
    types = []
    for entry in entries:
        annotations = entry.get("annotations") if isinstance(entry, dict) else None
        name = annotations.get(GPU_TYPE_KEY) if isinstance(annotations, dict) else None
        if isinstance(name, str):
            types.append(name)
            if name == gpu_type:
                return _descriptor(entry, f"the {gpu_type} entry of {reference}", MANIFEST_TYPE)
    raise Refused(f"{reference} has no pack for GPU type {gpu_type} (it has: {', '.join(types) or 'none'})")


def _artifact(session: Session, reference: Reference, gpu_type: str) -> tuple[str, str, dict[str, Any]]:
    """(the digest the reference names, the GPU type's manifest digest, that manifest)."""
    raw, top = session.manifest(reference.target)
    document = parse_json(raw, f"the manifest of {reference}")
    digest = top
    if _media_type(document) == INDEX_TYPE:
        entry = choose(document, gpu_type, reference)
        raw, digest = session.manifest(entry["digest"], (MANIFEST_TYPE,))
        if len(raw) != entry["size"]:
            raise Refused(f"the {gpu_type} manifest of {reference} is not the size its index names")
        document = parse_json(raw, f"the {gpu_type} manifest of {reference}")
    if _media_type(document) != MANIFEST_TYPE or document.get("artifactType") != ARTIFACT_TYPE:
        raise Refused(f"{reference} is not a gpu-cache pack (artifactType {ARTIFACT_TYPE})")
    return top, digest, document


def _config(session: Session, manifest: Mapping[str, Any], reference: Reference) -> dict[str, Any]:
    descriptor = _descriptor(manifest.get("config"), f"the config of {reference}", CONFIG_TYPE)
    if descriptor["size"] > MAX_CONFIG:
        raise Refused(f"the config of {reference} announces {descriptor['size']} bytes, more than a pack's")
    raw = session.blob(descriptor["digest"], descriptor["size"], f"the config of {reference}")
    config = parse_json(raw, f"the config of {reference}")
    if config.get("format") != CONFIG_FORMAT or config.get("format_version") != CONFIG_VERSION:
        raise Refused(
            f"{reference} is not a gpu-cache pack this version reads (config format "
            f"{config.get('format')!r} version {config.get('format_version')!r})"
        )
    return config


def _fit(
    config: Mapping[str, Any],
    kinds: list[str],
    gpu_type: str,
    python: str | None,
    image: str | None,
    reference: Reference,
) -> None:
    """unpack's checks of software and GPU type, on what the config says, before any layer
    is downloaded (unpack checks each layer's own manifest again)."""
    from gpu_cache.carry import fit_problems, target_software

    if config.get("gpu_type") != gpu_type:
        raise Refused(f"{reference} is a pack of GPU type {config.get('gpu_type')!r}, not {gpu_type}")
    target, words = target_software(python, image)
    manifest = {
        "software_by_kind": config.get("software_by_kind") or {},
        "device": config.get("device") or {},
    }
    try:
        problems, _notes = fit_problems(manifest, map(named, kinds), target, words, image, gpu_type)
    except (AttributeError, TypeError):
        raise Refused(f"the config of {reference} is not one gpu-cache writes") from None
    if problems:
        raise Refused(f"{reference} does not fit {words} and GPU type {gpu_type}: {'; '.join(problems)}")


def _layers(
    manifest: Mapping[str, Any], kinds: Iterable[str] | None, reference: Reference, notes: list[str]
) -> dict[str, dict[str, Any]]:
    """The layers to fetch by kind: those of carried kinds (``kinds``: of those only)."""
    layers = manifest.get("layers")
    if not isinstance(layers, list):
        raise Refused(f"the manifest of {reference} has no layers")
    chosen: dict[str, dict[str, Any]] = {}
    for number, layer in enumerate(layers):
        descriptor = _descriptor(layer, f"layer {number} of {reference}", LAYER_TYPE)
        annotations = descriptor.get("annotations")
        kind = annotations.get(KIND_KEY) if isinstance(annotations, dict) else None
        if not isinstance(kind, str) or kind in chosen:
            raise Refused(f"layer {number} of {reference} names no kind, or one another layer has")
        if kind not in names_of(CARRIED):  # a newer gpu-cache's kind: its entries are not read here
            notes.append(f"layer of kind {kind!r} left out: this gpu-cache does not carry it")
        elif kinds is None or kind in kinds:
            chosen[kind] = descriptor
    return chosen


def fetch(
    *,
    root: Path | None,
    reference: Reference,
    gpu_type: str,
    python: str | None = None,
    image: str | None = None,
    kinds: Iterable[str] | None = None,
    team: Team | None = None,
    environ: Mapping[str, str] | None = None,
) -> FetchReport:
    """Fetch ``gpu_type``'s pack from ``reference`` (a tag or digest) into ``root``.

    Raises:
        Refused: damaged, of other software or GPU type, or hostile: nothing written.
        RegistryError: the registry cannot be reached or refused a request: nothing written.
        UsageError: no cache root, a bad kind.
    """
    from gpu_cache import carry

    if root is None:
        raise UsageError("fetch needs a cache root (caching is turned off)")
    asked = None if kinds is None else [kind.name for kind in carry.check_kinds(kinds)]
    session = Session(reference, environ)
    top, digest, manifest = _artifact(session, reference, gpu_type)
    report = FetchReport(str(reference), top, gpu_type, digest)
    config = _config(session, manifest, reference)
    layers = _layers(manifest, asked, reference, report.notes)
    _fit(config, list(layers), gpu_type, python, image, reference)
    report.bytes = sum(d["size"] for d in layers.values())
    folder = Path(tempfile.mkdtemp(prefix="gpu-cache-fetch-"))  # mode 0700: this user's alone
    try:
        free = shutil.disk_usage(folder).free
        if report.bytes > free:
            raise Refused(
                f"the pack needs {format_size(report.bytes)} in {folder.parent}, which has "
                f"{format_size(free)} free (set TMPDIR)"
            )
        for kind, descriptor in layers.items():
            session.download(
                descriptor["digest"], descriptor["size"], folder / f"{kind}.tar.gz", f"{kind} layer"
            )
        options = {
            "root": root,
            "gpu_type": gpu_type,
            "python": python,
            "image": image,
            "team": team,
        }
        for kind in layers:  # every layer checked whole before the first entry is written
            checked = _unpack_layer(folder / f"{kind}.tar.gz", kind, reference, options, dry_run=True)
            report.notes += checked.notes
        for kind in layers:
            report.unpacked[kind] = _unpack_layer(
                folder / f"{kind}.tar.gz", kind, reference, options, dry_run=False
            ).as_dict()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    log.info("fetch: %s was %s", reference, reference.at(top))
    return report


def _unpack_layer(path: Path, kind: str, reference: Reference, options: dict[str, Any], dry_run: bool) -> Any:
    from gpu_cache import carry

    try:
        report = carry.unpack(archive=path, kinds=[kind], dry_run=dry_run, **options)
    except carry.Refused as exc:
        raise Refused(f"the {kind} layer of {reference}: {exc.reason}") from None
    except UsageError as exc:  # not an archive gpu-cache reads: from the registry, that is damage
        raise Refused(f"the {kind} layer of {reference}: {exc}") from None
    if report.damaged:
        raise Refused(f"the {kind} layer of {reference}: {report.failures()[0]}")
    return report
