import hashlib
import zlib
from pathlib import Path


def write(folder: Path, number: int) -> str:
    """A JAX entry: ``<name>-<sha256>-cache``, a zlib stream (JAX without zstandard)."""
    key = f"jit_f{number}-{hashlib.sha256(b'jax %d' % number).hexdigest()}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{key}-cache").write_bytes(zlib.compress(b"an executable %d " % number * 4000))
    return key
