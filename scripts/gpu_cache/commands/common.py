"""What the subcommands share: the arguments every cache command takes, the settings they
give, the JSON and text they write, and where the workloads' output goes."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from gpu_cache.config.host import load_config_files
from gpu_cache.config.settings import Settings, settings_from
from gpu_cache.core import names
from gpu_cache.core.errors import UsageError


def warn(message: str, *args: Any) -> None:
    """A warning through the ``gpu_cache`` logger (logging is loaded only when one is due)."""
    import logging

    logging.getLogger(__name__).warning(message, *args)


def add_common(parser: argparse.ArgumentParser) -> None:
    """The arguments every cache command takes."""
    parser.add_argument("--cache-root", metavar="DIR",
                        help=f"cache root (default: config, ${names.ROOT_VAR}, $XDG_CACHE_HOME/gpu-cache, "
                             "~/.cache/gpu-cache); 'none' turns caching off")
    parser.add_argument("--config", metavar="FILE", action="append",
                        help="YAML or JSON config (same keys as the workflow's), or a host pipeline's "
                             "config: then its gpu_cache: block; given again, the next file is merged "
                             "in as Snakemake merges --configfile files (a host's config, then the "
                             "file of gpu-cache's settings for it)")
    parser.add_argument("--config-key", metavar="KEY",
                        help="with --config: the top-level key of the block that holds gpu-cache's "
                             "config in a host's file (default: gpu_cache, where there is one)")
    parser.add_argument("--config-json", metavar="JSON", help=argparse.SUPPRESS)  # from the rules


def add_phase_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments warm and validate share."""
    parser.add_argument("--gpu-type", help="GPU type to work on (default: this machine's)")
    parser.add_argument("--output", metavar="FILE", help="write the JSON report here (default: stdout)")
    parser.add_argument("--log", metavar="FILE", help="append the workloads' output here (default: stderr)")


def add_report_inputs(parser: argparse.ArgumentParser) -> None:
    """The reports that summary and plots read."""
    parser.add_argument("--validate", nargs="*", default=[], metavar="FILE",
                        help="validate/{gpu_type}.json files")
    parser.add_argument("--prune", metavar="FILE", help="prune.json")


def settings(args: argparse.Namespace) -> Settings:
    """The settings that ``--config``/``--config-json`` and ``--cache-root`` give."""
    config: dict[str, Any] | None = None
    if getattr(args, "config_key", None) and not getattr(args, "config", None):
        raise UsageError("--config-key needs --config: the file whose block it names")
    if getattr(args, "config", None):
        config = load_config_files(args.config, getattr(args, "config_key", None))
    if getattr(args, "config_json", None):
        import json

        try:
            config = json.loads(args.config_json)
        except ValueError as exc:
            raise UsageError(f"--config-json is not JSON: {exc}") from None
        except RecursionError:  # the decoder recurses once per level
            raise UsageError("--config-json nests deeper than JSON can be read") from None
        if not isinstance(config, dict):
            raise UsageError("--config-json must be a JSON object of config keys")
    found = settings_from(config, cache_root=args.cache_root)
    if found.shared_group is not None:
        from gpu_cache.jobenv.trust import share_with_group

        share_with_group()  # what warm/validate start writes group-writable entries
    return found


def gpu_type(found: Settings, requested: str | None) -> str:
    """``--gpu-type``, else the first GPU type of the settings."""
    from gpu_cache.config.targets import GPU_TYPE_NAME, gpu_types
    from gpu_cache.core.shown import excerpt

    if requested is not None and not GPU_TYPE_NAME.fullmatch(requested):
        raise UsageError(f"--gpu-type {excerpt(requested)}: a GPU type is letters, digits, '.', '_' and '-'")
    return requested or next(iter(gpu_types(found)))


def announce(command: str, found: Settings, gpu_type: str, passes: str) -> None:
    """Say on stderr what ``warm`` or ``validate`` runs before it starts (minutes, often):
    the GPU type, each workload with its shapes, the passes and the cache root.

    Raises:
        UsageError: the GPU type or one of its workloads is unknown.
    """
    from gpu_cache.config.workloads import workloads_of
    from gpu_cache.core.shown import shown

    runs = "; ".join(f"{w.name} at shape{'s' if len(w.shapes) > 1 else ''} {', '.join(map(str, w.shapes))}"
                     for w in workloads_of(found, gpu_type))
    root = found.cache_root or "none (caching off)"
    print(shown(f"gpu-cache {command}: GPU type {gpu_type}: {runs}; {passes}; cache root {root}"),
          file=sys.stderr, flush=True)


@contextmanager
def log_stream(path: str | None) -> Iterator[TextIO]:
    """Where the workloads' output goes: appended to ``path``, else stderr."""
    if path is None:
        yield sys.stderr
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as stream:
        yield stream


def dumps(report: Any, compact: bool = False) -> str:
    """JSON text; ``compact`` for reports that grow with the cache (a prune of a million
    entries lists each one): no indentation, so the C encoder writes it, ten times faster."""
    import json  # (deferred: `gpu-cache env`, run at every Snakemake start, needs no JSON)

    if compact:
        return json.dumps(report, separators=(",", ":"), default=str) + "\n"
    return json.dumps(report, indent=2, default=str) + "\n"


def emit(report: dict[str, Any], output: str | None, to_stdout: bool = True, compact: bool = False) -> None:
    """Write ``report`` as JSON to ``--output`` (when given) and stdout (``to_stdout``)."""
    text = dumps(report, compact)
    if output:
        write_text(Path(output), text)
    if to_stdout:
        sys.stdout.write(text)


def write_text(target: Path, text: str) -> None:
    """Write ``text`` to the output ``target`` without ever replacing what it names, unless
    that is a regular file (:func:`gpu_cache.core.safe_io.write_output`): a regular file or a new
    path goes through a temporary file beside it and a rename; a symlink is followed; a
    character device or FIFO is written to; a folder, socket or block device is refused
    (exit 2); a FIFO that nobody reads is refused (exit 1)."""
    from gpu_cache.core.safe_io import write_output

    write_output(target, text, what="--output")
