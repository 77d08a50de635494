"""``gpu-cache env``: the cache environment as shell lines (``eval "$(gpu-cache env)"``), or JSON.

Snakemake's profile runs the same export at every start (:mod:`gpu_cache.profile`), so this
module imports nothing it does not need."""

from __future__ import annotations

import argparse
import sys

from gpu_cache.commands import common


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead")


def run(args: argparse.Namespace) -> int:
    from gpu_cache.jobenv import env

    exports = env.resolve(common.settings(args))
    if args.json:
        sys.stdout.write(common.dumps(exports.as_dict()))
        return 0
    # The bytes of each path as they are on disk, also when they are not UTF-8.
    sys.stdout.flush()
    sys.stdout.buffer.write(env.shell_lines(exports).encode("utf-8", "surrogateescape"))
    sys.stdout.buffer.flush()
    env.warn_once(exports, environ={})
    return 0
