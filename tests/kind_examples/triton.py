import base64
import hashlib
import json
import os
from pathlib import Path

from helpers import hook_piece


def write(folder: Path, number: int, size: int = 0) -> str:
    """A Triton key folder: the kernel's files and its ``__grp__`` manifest, which names them;
    with ``size``, a cubin of that many random bytes (a large entry)."""
    key = base64.b32encode(hashlib.sha256(b"triton %d" % number).digest()).decode()[:52]
    group = folder / key
    group.mkdir(parents=True)
    children = {}
    cubin = os.urandom(size) if size else b"\x7fELF cubin %d " % number * 500
    files = (("kern.json", b'{"name": "kern"}'), ("kern.cubin", cubin),
             ("kern.ptx", b"// ptx %d\n" % number * 200))
    for name, data in files:
        (group / name).write_bytes(data)
        children[name] = str(group / name)
    (group / "__grp__kern.json").write_text(json.dumps({"child_paths": children}))
    return key


def fetch(tier, key: str) -> None:
    """As Triton's tiered cache manager fetches a group it looks up (its children, then it)."""
    hook_piece("kinds.triton.tier_manager").fetch_group(tier, key, "__grp__kern.json",
                                                         f"{tier.local_folder('triton')}/{key}")


def promote(tier, key: str) -> None:
    """As Triton's tiered cache manager promotes a group it wrote."""
    hook_piece("kinds.triton.tier_manager").promote_key_files(
        tier, key, ["kern.json", "kern.cubin", "kern.ptx"], group_name="__grp__kern.json",
        shared_dir=f"{tier.shared_folder('triton')}/{key}")
