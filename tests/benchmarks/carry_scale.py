"""Benchmark: what pack and unpack cost at scale, and what checking a manifest costs.

    python tests/benchmarks/carry_scale.py [--entries 2000] [--entry-kib 512] [--manifest 100000] [--out FILE]

* ``pack`` and ``unpack`` of a JAX cache of ``--entries`` entries of ``--entry-kib`` each (zlib
  streams, as JAX writes without zstandard), beside one bare read of the same files (the page
  cache warm for all three): pack reads each file to check it decompresses, to take its digest
  and to add it; unpack goes through the archive twice (each member's safety first, then the
  writes) and checks each entry as it writes it (digests, JAX's decompression).
* the manifest check (:func:`gpu_cache.carry.carry.read_manifest`) of a manifest of
  ``--manifest`` entries, beside jsonschema's check of the same schema.

Prints the figures as JSON (and writes them to ``--out``), with the machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import tempfile
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from gpu_cache import carry
from gpu_cache.core import safe_io


def _seconds(call: object) -> float:
    started = time.perf_counter()
    call()  # type: ignore[operator]
    return round(time.perf_counter() - started, 3)


def _cache(root: Path, entries: int, size: int) -> int:
    folder = root / "jax"
    folder.mkdir(parents=True)
    total = 0
    for number in range(entries):
        data = zlib.compress(os.urandom(size), 1)  # random bytes: the stream is as large as the data
        key = f"jit_f{number}-{hashlib.sha256(str(number).encode()).hexdigest()}"
        (folder / f"{key}-cache").write_bytes(data)
        total += len(data)
    return total


def _bare_read(root: Path) -> None:
    for path in (root / "jax").iterdir():
        for _chunk in safe_io.iter_chunks(path):
            pass


def _manifest(entries: int) -> bytes:
    items = []
    for number in range(entries):
        key = f"jit_f{number}-{hashlib.sha256(str(number).encode()).hexdigest()}"
        items.append({"key": key, "name": f"jit_f{number}", "files": {f"{key}-cache": 123456},
                      "sha256": {f"{key}-cache": "0" * 64}, "size": 123456, "last_use": 1.8e9})
    return json.dumps({"format": carry.FORMAT, "format_version": carry.FORMAT_VERSION,
                       "kinds": {"jax": {"entries": items}}}).encode()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--entry-kib", type=int, default=512)
    parser.add_argument("--manifest", type=int, default=100_000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpu-cache-carry-scale-"))
    source = work / "source"
    size = _cache(source, args.entries, args.entry_kib << 10)
    _bare_read(source)  # the page cache warm for each of the three
    archive = work / "carry.tar"
    figures = {
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "entries": args.entries, "bytes": size,
        "bare_read_seconds": _seconds(lambda: _bare_read(source)),
        "pack_seconds": _seconds(lambda: carry.pack(root=source, archive=archive)),
        "unpack_seconds": _seconds(lambda: carry.unpack(root=work / "target", archive=archive)),
    }
    text = _manifest(args.manifest)
    manifest = carry.parse_manifest(text)
    import jsonschema

    figures["manifest"] = {
        "entries": args.manifest, "bytes": len(text),
        "json_seconds": _seconds(lambda: carry.parse_manifest(text)),
        "check_seconds": _seconds(lambda: carry.read_manifest(manifest)),
        "jsonschema_seconds": _seconds(lambda: jsonschema.Draft7Validator(carry.SCHEMA).validate(manifest)),
    }
    report = json.dumps(figures, indent=2)
    print(report)
    if args.out:
        args.out.write_text(report + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
