import hashlib
from pathlib import Path

import zstandard


def write(folder: Path, number: int) -> str:
    """A JAX entry: ``<name>-<sha256>-cache``, a zstd frame (JAX with zstandard, whose frames
    carry no checksum by default)."""
    key = f"jit_f{number}-{hashlib.sha256(b'jax %d' % number).hexdigest()}"
    folder.mkdir(parents=True, exist_ok=True)
    executable = bytes(range(256)) * 40 + b"%d" % number
    (folder / f"{key}-cache").write_bytes(zstandard.ZstdCompressor().compress(executable))
    return key


def fetch(tier, key: str) -> None:
    """As the JAX piece fetches an entry before JAX reads it (its own check: whole frames)."""
    from helpers import hook_piece

    tier.fetch("jax", f"{key}-cache", check=hook_piece("kinds.jax.cache").whole)


def promote(tier, key: str) -> None:
    """As the JAX piece promotes an entry JAX just wrote."""
    from helpers import hook_piece

    tier.promote("jax", f"{key}-cache", check=hook_piece("kinds.jax.cache").whole)
