"""One shape's outputs proof through the runner's own code, without a compile: a warm run that
kept its outputs as the reference and a validate run compared with it, each settled as the
runner settles them (``references.settle``), over a root of hand-written JAX entries
(tests/test_outputs_compare.py, tests/test_outputs_references.py)."""

from __future__ import annotations

import time
from pathlib import Path

#: The key of the one entry the writer compiled and the reader is served, as the hook records it.
KEY = "jit_f-" + "0" * 64


def settled(tmp_path: Path, phase: str, root: Path, folder: Path, arrays: dict, section: dict | None, *,
            again: dict | None = None, tier: Path | None = None):
    """One run of workload ``w`` shape 8 through the runner's own code: it wrote ``arrays`` (and
    its second run ``again``), its process's record says ``section`` of the JAX cache (None: no
    record), and the pass ``phase`` settles it (``references.settle``: the warm keeps its
    reference in ``folder``, the validate pass compares with it). Its report."""
    import numpy as np

    from gpu_cache.core import output_runs, references
    from gpu_cache.core.reports import RunResult

    scratch = tmp_path / f"{phase}-{time.monotonic_ns()}"
    scratch.mkdir(parents=True)
    np.savez(scratch / "out.npz", **arrays)
    if again is not None:
        np.savez(scratch / "out.again.npz", **again)
    name = output_runs.slug("w", 8)
    report = output_runs.Run({}, str(scratch / "out.npz"), None, scratch, name).report(True)
    records = [] if section is None else [{"wildcards": output_runs.wildcards("w", 8), "jax": section}]
    where = references.Pass(phase, "cpu", root, tier, folder, scratch)
    (run,) = references.settle(where, [RunResult("w", 8, 1.0, 0, outputs=report)], records)
    return run


def a_root(tmp_path: Path, *entries: str) -> Path:
    """A cache root holding the JAX entries ``entries`` (each its own bytes)."""
    root = tmp_path / "root"
    (root / "jax").mkdir(parents=True)
    for key in entries:
        (root / "jax" / f"{key}-cache").write_bytes(f"the executable the writer compiled for {key}".encode())
    return root


def proof(tmp_path: Path, writer: dict, reader: dict, *, mode: str = "identical", tolerance: float = 0.01,
          writer_again: dict | None = None, reader_again: dict | None = None,
          entry_now: bytes | None = None) -> dict:
    """One shape's proof through the runner's own code: a warm run that compiled the entry
    ``KEY`` (as its process's record says) wrote ``writer`` (and its second run ``writer_again``)
    and kept it as the reference (``references.settle``); a validate run served that entry (its
    bytes then ``entry_now``, where given) wrote ``reader`` (and ``reader_again``); the host
    judges it in ``mode``."""
    from gpu_cache.commands import outputs_proof
    from gpu_cache.core import references

    root = a_root(tmp_path, KEY)
    folder = references.folder_of(root, "f" * 24, {})
    warm = settled(tmp_path, "warm", root, folder, writer, {"hit_keys": [], "missed": [{"key": KEY}]},
                   again=writer_again)
    assert warm.outputs["reference"]["kept"] is True, warm.outputs
    if entry_now is not None:
        (root / "jax" / f"{KEY}-cache").write_bytes(entry_now)
    run = settled(tmp_path, "validate", root, folder, reader, {"hit_keys": [KEY], "missed": []},
                  again=reader_again)
    return outputs_proof.outcome(run, mode, tolerance)
