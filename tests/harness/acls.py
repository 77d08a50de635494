"""POSIX ACLs written as the kernel stores them (``setfacl`` is not installed here), for the
trust tests of gpu-cache and of the hook."""

from __future__ import annotations

import os
import struct
from pathlib import Path

from helpers import unavailable

#: ACL entry tags (Linux's acl_ea.h).
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20


def set_acl(folder: Path, *entries: tuple[int, int, int], default: bool = False) -> None:
    """Write a POSIX ACL as the kernel stores it (what `setfacl` does; not installed here):
    version 2, then (tag, perm, id) little-endian entries."""
    data = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)
    name = "system.posix_acl_default" if default else "system.posix_acl_access"
    try:
        os.setxattr(folder, name, data)
    except OSError as exc:
        message = f"this filesystem takes no POSIX ACLs ({exc.strerror})"
        unavailable(message)
