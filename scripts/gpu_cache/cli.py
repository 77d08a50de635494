"""The ``gpu-cache`` command line: it only dispatches. Each subcommand is a module of
:mod:`gpu_cache.commands` that owns its arguments and its handler; only the module of the
subcommand asked for is imported (``gpu-cache env`` runs at every Snakemake start).

Bad input is one line on stderr and exit code 2; a filesystem error that reaches the top is
one line and exit code 1; never a traceback. What the user wrote in it (a key, a path, a
value) is escaped (``core.shown``): a newline in it would split the line, ESC or CR drive the
terminal.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable

from gpu_cache import __version__
from gpu_cache.commands import COMMANDS
from gpu_cache.core.errors import UsageError
from gpu_cache.core.shown import shown

Handler = Callable[[argparse.Namespace], int]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]  # argparse would print the usage
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _no_command(_args: argparse.Namespace) -> int:
    raise UsageError(f"no command given; commands: {', '.join(COMMANDS)} (see `gpu-cache --help`)")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``gpu-cache`` argument parser: every subcommand by name, and ``command``'s own
    arguments and handler (its module is imported; the others are not)."""
    parser = _Parser(prog="gpu-cache", description="Warm, validate, prune and observe JIT compile caches.")
    parser.add_argument("--version", action="version", version=f"gpu-cache {__version__}")
    parser.set_defaults(handler=_no_command)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, about in COMMANDS.items():
        one = sub.add_parser(name, help=about.summary, description=about.summary)
        if name != command:
            continue
        module = importlib.import_module(about.module)
        if about.common:
            from gpu_cache.commands.common import add_common

            add_common(one)
        module.add_arguments(one)
        one.set_defaults(handler=module.run)
    return parser


def _command_of(argv: list[str]) -> str | None:
    """The subcommand ``argv`` names: its first word that is not an option."""
    return next((word for word in argv if not word.startswith("-")), None)


def _keep_path_bytes() -> None:
    """Print paths that are not valid UTF-8 (argv and the filesystem give them as surrogate
    escapes) as their own bytes, as the shell and `ls` do, instead of failing to encode them."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and stream.errors == "strict":
            reconfigure(errors="surrogateescape")


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    _keep_path_bytes()
    try:
        argv = sys.argv[1:] if argv is None else argv
        args = build_parser(_command_of(argv)).parse_args(argv)
        handler: Handler = args.handler
        return handler(args)
    except UsageError as exc:
        print(shown(f"gpu-cache: error: {exc}"), file=sys.stderr)
        return 2
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        print(shown(f"gpu-cache: error:{where}: {exc.strerror or exc}"), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("gpu-cache: interrupted", file=sys.stderr)
        return 130
