"""``gpu-cache fetch --list``: what a repository holds, tag by tag; ``gpu-cache publish
--retire``: remove a tag's index."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpu_cache.config.units import format_size
from gpu_cache.core.shown import shown_lines

from ._client import INDEX_TYPE, Reference, Session
from ._common import ARCH_KEY, GPU_TYPE_KEY, IMAGE_KEY, SOFTWARE_KEY, VERDICT_KEY, RegistryError
from ._fetch import parse_json
from ._publish import BYTES_KEY


def _loads(text: Any) -> Any:
    try:
        return json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None


def _pack(entry: Any) -> dict[str, Any]:
    annotations = entry.get("annotations") if isinstance(entry, dict) else None
    annotations = annotations if isinstance(annotations, dict) else {}
    return {
        "gpu_type": annotations.get(GPU_TYPE_KEY),
        "arch": annotations.get(ARCH_KEY),
        "image": annotations.get(IMAGE_KEY),
        "software": _loads(annotations.get(SOFTWARE_KEY)),
        "verdict": _loads(annotations.get(VERDICT_KEY)),
        "bytes": _loads(annotations.get(BYTES_KEY)),
        "manifest": entry.get("digest") if isinstance(entry, dict) else None,
    }


def listing(reference: Reference, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Each tag of the repository (only the reference's, when it names one) with its digest
    and the packs of its index."""
    session = Session(reference, environ)
    tags = [reference.tag] if reference.tag or reference.digest else sorted(session.tags())
    out = []
    for tag in tags:
        raw, digest = session.manifest(reference.digest or str(tag))
        try:
            document = parse_json(raw, "")
        except RegistryError:
            document = {}
        entries = document.get("manifests") if document.get("mediaType") == INDEX_TYPE else None
        out.append(
            {
                "tag": tag,
                "digest": digest,
                "gpu_cache": isinstance(entries, list),
                "packs": [_pack(e) for e in entries] if isinstance(entries, list) else [],
            }
        )
    return {"repository": reference.name, "tags": out}


def render_listing(found: Mapping[str, Any]) -> str:
    lines = [f"{found['repository']}: {len(found['tags'])} tags"]
    for tag in found["tags"]:
        lines.append(
            f"  {tag['tag'] or '(digest)'}  {found['repository']}@{tag['digest']}"
            + ("" if tag["gpu_cache"] else "  (not a gpu-cache index)")
        )
        for pack in tag["packs"]:
            software = pack["software"] if isinstance(pack["software"], dict) else {}
            verdict = pack["verdict"] if isinstance(pack["verdict"], dict) else {}
            words = ", ".join(f"{k} {v}" for k, v in software.items() if v)
            size = format_size(pack["bytes"]) if isinstance(pack["bytes"], int) else "?"
            lines.append(
                f"    {pack['gpu_type']} ({pack['arch']}): {words} in {pack['image']}; "
                f"{verdict.get('status', '?')}, {verdict.get('hits', '?')} hits, "
                f"{verdict.get('misses', '?')} misses; {size}"
            )
    return shown_lines(lines)  # tags and annotations are the registry's words


def retire(reference: Reference, environ: Mapping[str, str] | None = None) -> str:
    """Delete the index at ``reference``'s tag; its digest. Refused when another tag names the
    same index (a registry deletes a manifest with every tag that names it).

    Raises:
        RegistryError: no tag given, another tag shares it, or the registry does not delete.
    """
    if not reference.tag or reference.digest:
        raise RegistryError(f"retire names a tag ({reference.name}:TAG), not {reference}")
    session = Session(reference, environ)
    _, digest = session.manifest(reference.tag)
    sharing = [t for t in session.tags() if t != reference.tag and session.manifest(t)[1] == digest]
    if sharing:
        raise RegistryError(
            f"{reference} is the same index as tag(s) {', '.join(sharing)}: deleting it "
            "would remove them too; nothing deleted"
        )
    session.delete(digest)
    return digest
