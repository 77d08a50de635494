"""``gpu-cache publish``: the entries a passed validation of one GPU type used, as one OCI
artifact (a stable ``gpu-cache pack`` layer per carried kind), entered into the index at the
image's tag beside the artifacts of its other GPU types."""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_cache import __version__
from gpu_cache.core import safe_io, software
from gpu_cache.core.kinds import CARRIED, names_of
from gpu_cache.core.owners import Team
from gpu_cache.core.shown import shown_lines

from ._client import INDEX_TYPE, MANIFEST_TYPE, Reference, Session, sha256_digest
from ._common import (
    ARCH_KEY,
    ARTIFACT_TYPE,
    CONFIG_FORMAT,
    CONFIG_TYPE,
    CONFIG_VERSION,
    CREATED_KEY,
    DEVICE_KEY,
    GPU_TYPE_KEY,
    IMAGE_KEY,
    KIND_KEY,
    LAYER_TYPE,
    SOFTWARE_KEY,
    TITLE_KEY,
    VERDICT_KEY,
    RegistryError,
    log,
)

#: An index entry's annotation: the bytes of its layers (for the listing).
BYTES_KEY = "io.gpu-cache.bytes"
#: What the verdict proved of the outputs (issue 40): its mode and how many shapes had each
#: outcome ("identical", "within run-to-run noise", "not proven"), so a fetching site sees it.
OUTPUTS_KEY = "io.gpu-cache.outputs"
#: What of a verdict goes into the artifact (the rest is per-run detail).
VERDICT_FIELDS = ("status", "passed", "hits", "misses", "new_entries", "cold_seconds", "warm_seconds")


@dataclass
class PublishReport:
    reference: str
    digest: str  # the index's: what a site pins
    gpu_type: str
    manifest: str  # this GPU type's artifact
    layers: dict[str, dict[str, Any]] = field(default_factory=dict)  # kind -> digest, size, entries, uploaded
    kept: list[str] = field(default_factory=list)  # the other GPU types in the index
    #: Entries left out because another user could have written them (pack's ``untrusted``).
    untrusted: list[dict[str, str]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "digest": self.digest,
            "gpu_type": self.gpu_type,
            "manifest": self.manifest,
            "layers": self.layers,
            "other_gpu_types": self.kept,
            "untrusted": self.untrusted,
        }


def render_publish(report: PublishReport) -> str:
    name = report.reference.rsplit(":", 1)[0] if "@" not in report.reference else report.reference
    moved = [
        f"{kind} {len(x['entries']) if isinstance(x['entries'], list) else x['entries']} entries "
        f"({'uploaded' if x['uploaded'] else 'unchanged, already there'})"
        for kind, x in report.layers.items()
    ]
    lines = [
        f"published {report.reference} = {name}@{report.digest}",
        f"GPU type {report.gpu_type}: {report.manifest}; layers: {'; '.join(moved)}",
    ]
    if report.untrusted:
        lines.append(f"left out {len(report.untrusted)} entries another user could have written")
    if report.kept:
        lines.append(f"kept in the index: {', '.join(report.kept)}")
    return shown_lines(lines)  # the other GPU types are named by the index in the registry


def load_verdict(path: Path) -> dict[str, Any]:
    """A passed validation verdict (``validate/{gpu_type}.json``).

    Raises:
        RegistryError: it cannot be read, or it did not pass (only validated packs are published).
    """
    try:
        verdict = safe_io.load_json(path)
    except Exception as exc:  # noqa: BLE001 - load_json raises UsageError or OSError: one line either way
        raise RegistryError(f"cannot read the verdict {path}: {exc}") from None
    if not isinstance(verdict, dict) or not isinstance(verdict.get("gpu_type"), str):
        raise RegistryError(f"{path} is not a validation verdict (validate/{{gpu_type}}.json)")
    status = verdict.get("status", "passed")  # older verdicts have none
    # Each on its own: a verdict whose workloads never ran (``error``) has no misses either.
    if verdict.get("passed") is not True or status != "passed" or verdict.get("misses"):
        raise RegistryError(
            f"the validation of {verdict['gpu_type']} in {path} did not pass "
            f"({verdict.get('status')}): only validated caches are published"
        )
    return verdict


def _arch(gpu_type: str, device: Mapping[str, Any]) -> str:
    """The GPU's Triton target (``sm_90``), or the CPU's machine type for ``cpu``."""
    from gpu_cache.carry import target_of_gpu_type

    for name in (gpu_type, device.get("gpu_type")):
        if isinstance(name, str) and (target := target_of_gpu_type(name)):
            return target
    return f"cpu-{platform.machine()}" if device.get("gpu_type", gpu_type) == "cpu" else "unknown"


def fingerprint(identity: Mapping[str, Any]) -> dict[str, Any]:
    """The software a pack is for: Python, and the version of each distribution a kind's piece
    declares (``software.key_fields``)."""
    return {name: identity.get(name) for name in software.key_fields()}


def _annotations(gpu_type: str, verdict: Mapping[str, Any], total: int) -> dict[str, str]:
    device = verdict.get("device") if isinstance(verdict.get("device"), dict) else {}
    ran = verdict.get("software") if isinstance(verdict.get("software"), dict) else {}
    proof = verdict.get("outputs") if isinstance(verdict.get("outputs"), dict) else {}
    return {
        GPU_TYPE_KEY: gpu_type,
        ARCH_KEY: _arch(gpu_type, device),
        DEVICE_KEY: str(device.get("name") or "?"),
        IMAGE_KEY: str(ran.get("container") or ran.get("image") or "host"),
        SOFTWARE_KEY: json.dumps(fingerprint(ran), sort_keys=True),
        VERDICT_KEY: json.dumps({k: verdict.get(k) for k in VERDICT_FIELDS}, sort_keys=True),
        BYTES_KEY: str(total),
        OUTPUTS_KEY: json.dumps({"mode": proof.get("mode"), **(proof.get("counts") or {})}, sort_keys=True),
    }


def _packs(root: Path, gpu_type: str, folder: Path, team: Team | None,
           untrusted: list[dict[str, str]]) -> dict[str, tuple[Path, dict[str, Any]]]:
    """A stable pack per carried kind that has entries of ``gpu_type``: its file and manifest;
    the entries left out as another user's go to ``untrusted``."""
    from gpu_cache import carry

    out = {}
    quiet = logging.getLogger("gpu_cache.carry")  # its per-archive lines are not the user's files
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        for kind in names_of(CARRIED):
            path = folder / f"{kind}.tar.gz"
            report = carry.pack(root=root, archive=path, kinds=[kind], gpu_type=gpu_type, stable=True,
                                team=team)
            untrusted += report.untrusted
            if report.entries.get(kind):
                with carry.open_archive(path) as opened:
                    out[kind] = (path, opened.manifest)
    finally:
        quiet.setLevel(level)
    if not out:
        others = f" that no other user could have written ({len(untrusted)} left out)" if untrusted else ""
        raise RegistryError(
            f"no entry under {root}{others} was used by the validated passes of {gpu_type}: "
            "nothing to publish"
        )
    return out


def _merged_index(
    session: Session, reference: Reference, gpu_type: str, entry: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """The index at the tag with ``entry`` for ``gpu_type`` in place of the one it had.

    Raises:
        RegistryError: the tag names something else than a gpu-cache index, or packs of other
            software (one reference per image).
    """
    found = session.manifest_if_any(reference.target)
    if found is None:  # a new tag
        return {
            "schemaVersion": 2,
            "mediaType": INDEX_TYPE,
            "artifactType": ARTIFACT_TYPE,
            "manifests": [entry],
        }, []
    try:
        old = json.loads(found[0])
        others = [m for m in old["manifests"] if m["annotations"][GPU_TYPE_KEY] != gpu_type]
    except (ValueError, KeyError, TypeError):
        raise RegistryError(f"{reference} is not a gpu-cache index; publish to a tag of its own") from None
    for other in others:
        if other["annotations"].get(SOFTWARE_KEY) != entry["annotations"][SOFTWARE_KEY]:
            raise RegistryError(
                f"{reference} holds the {other['annotations'][GPU_TYPE_KEY]} pack of other software "
                f"({other['annotations'].get(SOFTWARE_KEY)}): one reference per image; publish to another tag"
            )
    kept = [str(m["annotations"][GPU_TYPE_KEY]) for m in others]
    return {
        "schemaVersion": 2,
        "mediaType": INDEX_TYPE,
        "artifactType": ARTIFACT_TYPE,
        "manifests": sorted([*others, entry], key=lambda m: m["annotations"][GPU_TYPE_KEY]),
    }, kept


def _canonical(document: Mapping[str, Any]) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def _upload_layers(
    session: Session, packs: dict[str, tuple[Path, dict[str, Any]]], report: PublishReport
) -> list[dict[str, Any]]:
    """Upload each pack the registry lacks; the layer descriptors (``report.layers``: each
    one's digest, size, entries and whether it was uploaded)."""
    layers = []
    for kind, (path, manifest) in packs.items():
        digest, size = _file_digest(path), path.stat().st_size
        uploaded = session.upload(path, digest, size, f"{kind} layer")
        entries = len(manifest["kinds"][kind]["entries"])
        report.layers[kind] = {"digest": digest, "size": size, "entries": entries, "uploaded": uploaded}
        layers.append({"mediaType": LAYER_TYPE, "digest": digest, "size": size,
                       "annotations": {KIND_KEY: kind, TITLE_KEY: path.name}})
    return layers


def publish(
    *, root: Path, reference: Reference, verdict: Mapping[str, Any], environ: Mapping[str, str] | None = None,
    team: Team | None = None,
) -> PublishReport:
    """Publish the entries that ``verdict``'s passes used under ``root`` to ``reference`` (a tag):
    those gpu-cache would itself read (``carry.pack``'s rule, with ``team``: the shared_group).

    Raises:
        RegistryError: the registry cannot be reached or refused a request, nothing to publish,
            or the tag holds something else.
        UsageError: no cache there, or no record of the GPU type's passes.
    """
    if reference.digest or not reference.tag:
        raise RegistryError(f"publish to a tag ({reference.name}:TAG), not {reference}")
    gpu_type = str(verdict["gpu_type"])
    session = Session(reference, environ)
    session.request("HEAD", f"manifests/{reference.tag}", ok=(200, 404))  # the login, before packing
    with tempfile.TemporaryDirectory(prefix="gpu-cache-publish-") as temp:
        report = PublishReport(str(reference), "", gpu_type, "")
        packs = _packs(root, gpu_type, Path(temp), team, report.untrusted)
        layers = _upload_layers(session, packs, report)
        total = sum(x["size"] for x in report.layers.values())
        annotations = _annotations(gpu_type, verdict, total)
        config = _canonical(
            {
                "format": CONFIG_FORMAT,
                "format_version": CONFIG_VERSION,
                "gpu_type": gpu_type,
                "gpu_cache_version": __version__,
                "annotations": annotations,
                "software_by_kind": {k: m["software_by_kind"].get(k, []) for k, (_, m) in packs.items()},
                "device": {k: m["device"].get(k, {}) for k, (_, m) in packs.items()},
                "kinds": {
                    k: {"entries": x["entries"], "bytes": x["size"], "layer": x["digest"]}
                    for k, x in report.layers.items()
                },
            }
        )
        config_path = Path(temp) / "config.json"
        config_path.write_bytes(config)
        session.upload(config_path, sha256_digest(config), len(config), "config")
    manifest_raw = _canonical(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "artifactType": ARTIFACT_TYPE,
            "config": {"mediaType": CONFIG_TYPE, "digest": sha256_digest(config), "size": len(config)},
            "layers": layers,
            "annotations": {**annotations, CREATED_KEY: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
        }
    )
    report.manifest = sha256_digest(manifest_raw)
    session.put_manifest(report.manifest, manifest_raw, MANIFEST_TYPE)
    entry = {
        "mediaType": MANIFEST_TYPE,
        "artifactType": ARTIFACT_TYPE,
        "digest": report.manifest,
        "size": len(manifest_raw),
        "annotations": annotations,
    }
    index, report.kept = _merged_index(session, reference, gpu_type, entry)
    index_raw = _canonical(index)
    session.put_manifest(str(reference.tag), index_raw, INDEX_TYPE)
    report.digest = sha256_digest(index_raw)
    log.info("publish: %s is now %s", reference, reference.at(report.digest))
    return report


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    for chunk in safe_io.iter_chunks(path):
        digest.update(chunk)
    return "sha256:" + digest.hexdigest()
