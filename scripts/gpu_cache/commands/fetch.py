"""``gpu-cache fetch REF``: a GPU type's validated pack from an OCI registry (issue 32)."""

from __future__ import annotations

import argparse
import sys

from gpu_cache.commands import common
from gpu_cache.core import kinds
from gpu_cache.core.errors import UsageError
from gpu_cache.core.shown import shown


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "reference",
        metavar="REF",
        help="HOST/REPOSITORY:TAG or HOST/REPOSITORY@sha256:... (with --list: HOST/REPOSITORY for every tag)",
    )
    parser.add_argument("--gpu-type", help="the GPU type whose pack to fetch (default: this machine's)")
    target = parser.add_mutually_exclusive_group()
    target.add_argument(
        "--python",
        metavar="PY",
        help="the jobs' Python, whose software the pack must fit (default: this one)",
    )
    target.add_argument(
        "--image", metavar="IMAGE", help="the jobs' container image, whose software the pack must fit"
    )
    parser.add_argument(
        "--kind",
        action="append",
        metavar="KIND",
        help=f"fetch only this kind ({', '.join(kinds.names_of(kinds.CARRIED))}); repeatable",
    )
    parser.add_argument("--list", action="store_true", help="list what the repository holds instead")
    parser.add_argument("--output", metavar="FILE", help="also write the JSON report here")
    parser.add_argument("--json", action="store_true", help="print the JSON report")
    parser.add_argument(
        "--no-fail",
        action="store_true",
        help="a registry that cannot be reached or a pack that is refused is one "
        "warning and exit 0 (the workflow's fetch rule uses this)",
    )


def run(args: argparse.Namespace) -> int:
    settings = common.settings(args)
    from gpu_cache import oci
    reference = oci.parse_reference(args.reference)
    try:
        if args.list:
            found = oci.listing(reference)
            sys.stdout.write(oci.render_listing(found) if not args.json else "")
            common.emit(found, args.output, to_stdout=args.json)
            return 0
        report = oci.fetch(
            root=settings.cache_root,
            reference=reference,
            gpu_type=common.gpu_type(settings, args.gpu_type),
            python=args.python,
            image=args.image,
            kinds=args.kind,
            team=settings.team,
        )
    except (oci.RegistryError, UsageError, OSError) as exc:  # the workflow's run goes on: --no-fail
        if not args.no_fail:
            if not isinstance(exc, oci.RegistryError):
                raise  # bad input: exit 2; a filesystem error: exit 1 (cli.main)
            print(f"gpu-cache: error: {shown(str(exc))}", file=sys.stderr)  # the registry's words
            return 1
        if isinstance(exc, OSError):
            exc = OSError(f"{exc.filename or ''}: {exc.strerror or exc}")
        print(f"gpu-cache: warning: not fetched, the warm step compiles everything: {shown(str(exc))}",
              file=sys.stderr)
        common.emit({"fetched": False, "reference": str(reference), "why": str(exc)}, args.output,
                    to_stdout=False)
        return 0
    sys.stdout.write(oci.render_fetch(report, reference.name) if not args.json else "")
    common.emit(report.as_dict(), args.output, to_stdout=args.json)
    return 0
