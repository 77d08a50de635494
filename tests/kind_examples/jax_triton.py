import hashlib
from pathlib import Path

from gpu_cache.core.kinds import jax_triton_format as kernel_cache
from helpers import hook_piece


def write(folder: Path, number: int) -> str:
    """A kernel the startup hook kept: its JSON with the sha256 of its content, as the hook's
    store writes it (``gpu_cache_hook.kinds.jax_triton.store.sealed``), named by its key."""
    key = hashlib.sha256(b"jax_triton %d" % number).hexdigest()
    name = f"add_{number}"
    ptx = f".version 8.4\n.target sm_90a\n.address_size 64\n.visible .entry {name}(\n)\n{{ ret; }}\n"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / key).write_bytes(hook_piece("kinds.jax_triton.store").sealed({
        "format": kernel_cache.FORMAT, "key": key, "kernel": name, "module": "m",
        "jax_triton": "0.3.1", "triton": "3.6.0", "target": "sm_90", "ttir": "tt.func @add {}",
        "result": {"binary": ptx + "// padding\n" * 300, "name": name, "shared_mem_bytes": 0,
                   "ttgir": None, "llir": None}}))
    return key


def fetch(tier, key: str) -> None:
    """As the jax-triton store fetches a kernel it looks up."""
    tier.fetch("jax_triton", key)


def promote(tier, key: str) -> None:
    """As the jax-triton store promotes a kernel it wrote."""
    tier.promote("jax_triton", key)
