"""Archives made by hand for the pack/unpack tests: a pack rebuilt with edits, special members."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_cache import carry


def rebuild(source: Path, target: Path, edit: Callable[[dict[str, Any]], None] | None = None,
            members: list[tuple[tarfile.TarInfo, bytes | None]] | None = None, keep: bool = True) -> Path:
    """A copy of the archive ``source`` with its manifest edited and ``members`` appended
    (``keep=False``: instead of its own members)."""
    with tarfile.open(source) as tar:
        own = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]  # type: ignore[union-attr]
    manifest = json.loads(own[0][1])
    if edit:
        edit(manifest)
    data = json.dumps(manifest).encode()
    with tarfile.open(target, "w:gz", format=tarfile.PAX_FORMAT) as out:
        info = tarfile.TarInfo(carry.MANIFEST_NAME)
        info.size = len(data)
        out.addfile(info, io.BytesIO(data))
        for member, content in (own[1:] if keep else []) + (members or []):
            out.addfile(member, io.BytesIO(content) if content is not None else None)
    return target


def special(name: str, kind: bytes, size: int = 0, link: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, size
    info.devmajor, info.devminor = 1, 3
    return info, None
