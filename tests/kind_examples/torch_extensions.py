import hashlib
import json
from pathlib import Path

from gpu_cache.core.kinds import torch_extensions


def write(folder: Path, number: int) -> str:
    """One keyed build, as the startup hook renames it into place: its library, its ninja file
    and its manifest."""
    key = hashlib.sha256(b"extension %d" % number).hexdigest()[:32]
    name = f"ext_{number}"
    entry = folder / f"{name}-{key}"
    entry.mkdir(parents=True)
    library = b"\x7fELF extension %d " % number * 300
    (entry / f"{name}.so").write_bytes(library)
    (entry / "build.ninja").write_text(f"build {name}.so: link main.o\n")
    parts = {"name": name, "sources": key, "flags": "[]", "torch": "2.13.0", "compiler": "g++ 12.2.0",
             "python": "cpython-311", "cuda": ""}
    (entry / torch_extensions.MANIFEST).write_text(json.dumps({
        "format": 1, "key": key, "name": name, "parts": parts, "library": f"{name}.so",
        "size": len(library), "sha256": hashlib.sha256(library).hexdigest(), "headers": {},
        "build_seconds": 1.5}))
    return f"{name}-{key}"
