from pathlib import Path

from gpu_cache.core.kinds import cuda_format as cuda_cache


def write(folder: Path, number: int) -> str:
    """The driver's cache: its index and one hashed file (the whole folder is one entry)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / cuda_cache.INDEX).write_bytes(b"i" * 100)
    (folder / "7" / "a").mkdir(parents=True, exist_ok=True)
    (folder / "7" / "a" / f"e0943aa8a566c{number:x}").write_bytes(b"p" * 1000)
    return cuda_cache.LAYOUT
