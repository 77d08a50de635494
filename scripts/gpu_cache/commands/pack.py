"""``gpu-cache pack``: warmed cache entries into one archive, with a manifest (docs/carry.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpu_cache.commands import common
from gpu_cache.config.settings import Settings
from gpu_cache.core import kinds
from gpu_cache.core.errors import UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("archive", metavar="ARCHIVE", help="the archive to write: .tar, .tar.gz/.tgz, "
                                                           ".tar.xz/.txz or .tar.bz2/.tbz2")
    parser.add_argument("--kind", action="append", metavar="KIND",
                        help=f"pack this kind ({', '.join(kinds.names_of(kinds.CARRIED))}); repeatable "
                             "(default: all)")
    parser.add_argument("--gpu-type", help="only the entries this GPU type's warm and validate passes "
                                           "used (from the records)")
    parser.add_argument("--workload", help="only the entries this workload's warm and validate passes "
                                           "used (from the records)")
    parser.add_argument("--json", action="store_true", help="print a JSON report")


def run(args: argparse.Namespace) -> int:
    from gpu_cache import carry

    settings = common.settings(args)
    if settings.cache_root is None:
        raise UsageError("pack needs a cache root (caching is turned off)")
    matcher = carry.workload_matcher(settings, args.workload) if args.workload else None
    report = carry.pack(root=settings.cache_root, archive=Path(args.archive), kinds=args.kind,
                        gpu_type=args.gpu_type, workload=args.workload, matcher=matcher,
                        tier=_trusted_tier(settings), team=settings.team)
    sys.stdout.write(common.dumps(report.as_dict()) if args.json else carry.render_pack(report))
    return 0


def _trusted_tier(settings: Settings) -> Path | None:
    """This node's local tier of the cache root where it may be read; one that is not trusted
    is left out, with a warning (its entries could be anyone's)."""
    from gpu_cache.jobenv import tier

    here = tier.on_this_node(settings)
    if here is not None and here.problem:
        common.warn("local tier left out: %s", here.problem)
        return None
    return here.folder if here is not None else None
