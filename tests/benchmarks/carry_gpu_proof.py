"""Proof that Triton kernels built on a CPU-only machine, carried with ``gpu-cache pack`` and
``gpu-cache unpack`` to ANOTHER path on a GPU machine, are hit there.

Two steps, each a subcommand (the workload runs and key components come from
``triton_gpu_proof.py``, the same-path proof, which this one reuses):

``pack`` (on the CPU machine, with the same Python minor version and triton wheel as the GPU
machine: unpack refuses the archive otherwise, since both are in Triton's keys)::

    PYTHONPATH=scripts python tests/benchmarks/carry_gpu_proof.py pack \\
        --archive carry.tar.gz --shapes 1000,4096 --targets sm_90

``gpu`` (on the GPU machine)::

    PYTHONPATH=scripts python3 tests/benchmarks/carry_gpu_proof.py gpu \\
        --archive carry.tar.gz --shapes 1000,4096 --out carry.json

``gpu`` unpacks the archive (``gpu_cache.carry.unpack``, Triton entries only, checked against this
interpreter's software and this machine's GPU type) into a fresh root at a path the CPU machine
never used, checks that every group file points inside the new root, then runs the built-in
``triton-kernels`` workload (jit mode: real launches, results checked) there in a fresh process per
shape. It prints one JSON object: Triton's listener events per kernel (``cache_hit``), hits,
misses, new kernel entries, and the unpack report. Exit code 0 when every kernel was a hit, 1
otherwise (or when unpack refused the archive: the refusal is in the JSON).

``--workload-mode aot`` in ``gpu`` only checks this script's plumbing on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from triton_gpu_proof import entry_keys, key_components, run_workload

from gpu_cache import carry
from gpu_cache.core import device


def _shapes(text: str) -> list[int]:
    return [int(s) for s in text.split(",") if s.strip()]


def pack(args: argparse.Namespace) -> int:
    """Compile the workload's kernels ahead of time into a fresh root and pack its Triton entries."""
    root = Path(tempfile.mkdtemp(prefix="gpu-cache-carry-cpu-")) / "root"
    runs = [run_workload(n, root / "triton", ["--mode", "aot", "--targets", args.targets], {})
            for n in _shapes(args.shapes)]
    report = carry.pack(root=root, archive=Path(args.archive).absolute(), kinds=("triton",))
    print(json.dumps({"host": platform.node(), "machine": "CPU only", "packed_from": str(root),
                      "pack": report.as_dict(), "key_components": key_components(),
                      "aot_runs": [{k: r[k] for k in ("shape", "kernels", "misses", "targets")}
                                   for r in runs]}, indent=2))
    return 0


def gpu(args: argparse.Namespace) -> int:
    """Unpack into a fresh root here and run the workload there; print hits and misses."""
    root = Path(args.root or tempfile.mkdtemp(prefix="gpu-cache-carry-gpu-")) / "carried root"
    here = device.detect()
    result: dict[str, Any] = {"device": here.as_dict(), "python": sys.version.split()[0],
                              "key_components": key_components(), "cache_root": str(root)}
    try:
        report = carry.unpack(root=root, archive=Path(args.archive), kinds=("triton",),
                              gpu_type=None if here.gpu_type == "cpu" else here.gpu_type)
    except carry.Refused as exc:
        result["refused"] = str(exc)
        print(json.dumps(result, indent=2))
        return 1
    result["unpack"] = report.as_dict()
    folder = root / "triton"
    groups = list(folder.glob("*/__grp__*.json"))
    result["group_files_inside_root"] = all(
        Path(child).parent == group.parent
        for group in groups for child in json.loads(group.read_text())["child_paths"].values())
    before = entry_keys(folder)
    extra = ["--mode", args.workload_mode]
    if args.workload_mode == "aot":
        extra += ["--targets", args.targets]
    runs = [run_workload(n, folder, extra, {}) for n in _shapes(args.shapes)]
    events = [{"shape": r["shape"], **e} for r in runs for e in r["events"]]
    new = {k: v for k, v in entry_keys(folder).items() if k not in before}
    result.update({
        "kernels": len(events),
        "hits": sum(1 for e in events if e["cache_hit"] is True),
        "misses": sum(1 for e in events if e["cache_hit"] is False),
        "new_kernel_entries": sum(1 for v in new.values() if v.startswith("kernel")),
        "new_other_entries": sorted(new.values()),
        "first_call_seconds": round(sum(e["seconds"] for e in events), 3),
        "process_wall_seconds": round(sum(r["process_wall_seconds"] for r in runs), 3),
        "events": events,
    })
    result["passed"] = (result["misses"] == 0 and result["hits"] == len(events) > 0
                        and result["group_files_inside_root"] and len(groups) > 0)
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0 if result["passed"] else 1


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: ``pack`` on the CPU machine, ``gpu`` on the GPU machine."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("pack")
    p.add_argument("--archive", required=True)
    p.add_argument("--shapes", default="1000,4096")
    p.add_argument("--targets", default="sm_90")
    g = sub.add_parser("gpu")
    g.add_argument("--archive", required=True)
    g.add_argument("--shapes", default="1000,4096")
    g.add_argument("--root", help="folder for the fresh cache root (default: a new temporary one)")
    g.add_argument("--out", help="also write the JSON here")
    g.add_argument("--workload-mode", choices=("jit", "aot"), default="jit",
                   help="aot only checks this script's plumbing on a machine without a GPU")
    g.add_argument("--targets", default="sm_90", help="with --workload-mode aot")
    args = parser.parse_args(argv)
    return pack(args) if args.step == "pack" else gpu(args)


if __name__ == "__main__":
    sys.exit(main())
