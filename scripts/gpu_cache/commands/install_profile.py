"""``gpu-cache install-profile``: install a shipped Snakemake profile (``--profile gpu-cache``)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", default="gpu-cache", help="shipped profile to install (default: gpu-cache)")
    parser.add_argument("--target", metavar="DIR", help="folder to install into "
                                                        "(default: $XDG_CONFIG_HOME/snakemake/<name>)")
    parser.add_argument("--force", action="store_true", help="replace an existing, different profile")
    parser.add_argument("--cache-root", help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    from gpu_cache.profile import install_profile

    target = install_profile(args.name, Path(args.target) if args.target else None, args.force)
    print(f"installed profile {args.name} in {target}; use it with: snakemake --profile {args.name}")
    return 0
