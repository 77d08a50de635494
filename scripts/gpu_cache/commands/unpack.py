"""``gpu-cache unpack``: check an archive against this target and add its entries to the
cache (docs/carry.md); exit 1 when it is refused or holds damaged entries."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpu_cache.commands import common
from gpu_cache.core import kinds
from gpu_cache.core.shown import shown


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("archive", metavar="ARCHIVE", help="an archive written by `gpu-cache pack`")
    parser.add_argument("--kind", action="append", metavar="KIND",
                        help=f"unpack only this kind ({', '.join(kinds.names_of(kinds.CARRIED))}); "
                             "repeatable (default: all in it)")
    parser.add_argument("--gpu-type", help="the GPU type the entries are for: JAX entries must have been "
                                           "compiled on it, Triton ones for its compute capability")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--python", metavar="PY", help="the jobs' Python (run to learn its jax, "
                                                       "triton and Python versions; default: this one)")
    target.add_argument("--image", metavar="IMAGE", help="the jobs' container image (run with "
                                                         "apptainer where there is one, else its name "
                                                         "is compared)")
    parser.add_argument("--force", action="store_true", help="unpack even when the archive does not fit")
    parser.add_argument("--dry-run", action="store_true", help="check and report; write nothing")
    parser.add_argument("--json", action="store_true", help="print a JSON report")


def run(args: argparse.Namespace) -> int:
    from gpu_cache import carry

    settings = common.settings(args)
    try:
        report = carry.unpack(root=settings.cache_root, archive=Path(args.archive), kinds=args.kind,
                              gpu_type=args.gpu_type, python=args.python, image=args.image,
                              force=args.force, dry_run=args.dry_run, team=settings.team)
    except carry.Refused as exc:  # a mismatch or an unsafe archive: one line, exit 1
        print(shown(f"gpu-cache: error: {exc}"), file=sys.stderr)  # (the archive's name, its words)
        return 1
    sys.stdout.write(common.dumps(report.as_dict()) if args.json else carry.render_unpack(report))
    for line in report.failures():  # entries damaged in the archive: never a success
        print(shown(f"gpu-cache: error: {line}"), file=sys.stderr)
    return 1 if report.damaged else 0
