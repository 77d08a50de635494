"""``gpu-cache publish REF``: a validated GPU type's entries to an OCI registry (issue 32)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpu_cache.commands import common
from gpu_cache.core.errors import UsageError
from gpu_cache.core.shown import shown


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "reference",
        metavar="REF",
        help="HOST/REPOSITORY:TAG, one tag per image (e.g. registry.example.org/lab/af3-cache:2.6.2)",
    )
    parser.add_argument(
        "--verdict",
        metavar="FILE",
        help="the passed verdict of the GPU type (default: "
        "results/gpu-cache/validate/<--gpu-type or this machine's>.json)",
    )
    parser.add_argument(
        "--gpu-type",
        help="the GPU type whose verdict to publish (default: the verdict's, else this machine's)",
    )
    parser.add_argument("--retire", action="store_true", help="delete the tag REF instead (its index)")
    parser.add_argument("--output", metavar="FILE", help="also write the JSON report here")
    parser.add_argument("--json", action="store_true", help="print the JSON report")
    parser.add_argument(
        "--no-fail",
        action="store_true",
        help="a registry that fails, or a verdict that did not pass, is one warning and "
        "exit 0 (the workflow's publish rule uses this)",
    )


def run(args: argparse.Namespace) -> int:
    settings = common.settings(args)
    from gpu_cache import oci
    reference = oci.parse_reference(args.reference)
    try:
        if args.retire:
            digest = oci.retire(reference)
            print(f"retired {reference} (it was {reference.at(digest)})")
            return 0
        if settings.cache_root is None:
            raise UsageError("publish needs a cache root (caching is turned off)")
        gpu_type = args.gpu_type
        path = (
            Path(args.verdict)
            if args.verdict
            else Path("results/gpu-cache/validate") / f"{common.gpu_type(settings, gpu_type)}.json"
        )
        verdict = oci.load_verdict(path)
        if gpu_type is not None and verdict["gpu_type"] != gpu_type:
            raise UsageError(f"{path} is the verdict of {verdict['gpu_type']}, not --gpu-type {gpu_type}")
        report = oci.publish(root=settings.cache_root, reference=reference, verdict=verdict,
                             team=settings.team)
    except (oci.RegistryError, UsageError, OSError) as exc:  # the workflow's run goes on: --no-fail
        if not args.no_fail:
            if not isinstance(exc, oci.RegistryError):
                raise  # bad input: exit 2; a filesystem error: exit 1 (cli.main)
            print(f"gpu-cache: error: {shown(str(exc))}", file=sys.stderr)  # the registry's words
            return 1
        if isinstance(exc, OSError):
            exc = OSError(f"{exc.filename or ''}: {exc.strerror or exc}")
        print(f"gpu-cache: warning: not published: {shown(str(exc))}", file=sys.stderr)
        if args.output:
            common.emit({"published": False, "reference": str(reference), "why": str(exc)}, args.output,
                        to_stdout=False)
        return 0
    if args.output:
        common.emit({"published": True, **report.as_dict()}, args.output, to_stdout=False)
    sys.stdout.write(oci.render_publish(report) if not args.json else "")
    if args.json:
        common.emit({"published": True, **report.as_dict()}, None)
    return 0
