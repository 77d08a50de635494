import hashlib
from pathlib import Path

from gpu_cache._hook.gpu_cache_hook import digest
from gpu_cache.core.kinds import ptxas_format as ptxas_cache


def write(folder: Path, number: int) -> str:
    """One result of the ptxas shim: its header, then stdout, stderr and the cubin, framed with
    their digest."""
    key = hashlib.sha256(b"ptxas %d" % number).hexdigest()
    cubin = b"\x7fELF cubin %d " % number * 300
    meta = ptxas_cache.META_SEP.join((f"kern_{number}", "ptxas 12.9", "ab" * 8, "-arch=sm_90a", "cd" * 8))
    body = b"%s\n%d %d %d 0.5\n%s\n" % (key.encode(), 0, 0, len(cubin), meta.encode())
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{key}.ptxas").write_bytes(digest.framed(ptxas_cache.ENTRY_MAGIC + body + cubin))
    return f"{key}.ptxas"
