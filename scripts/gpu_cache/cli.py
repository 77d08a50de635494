"""The ``gpu-cache`` command line: one handler per subcommand.

Bad input is one line on stderr and exit code 2; a filesystem error that reaches the top is
one line and exit code 1; never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from gpu_cache import __version__
from gpu_cache.config.settings import Settings, load_config_file, settings_from
from gpu_cache.core import kinds
from gpu_cache.core.errors import UsageError

Handler = Callable[[argparse.Namespace], int]


def _warn(message: str, *args: Any) -> None:
    """A warning through the ``gpu_cache`` logger (logging is loaded only when one is due)."""
    import logging

    logging.getLogger(__name__).warning(message, *args)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]  # argparse would print the usage
        raise UsageError(f"{message} (see `{self.prog} --help`)")


# --- shared plumbing -------------------------------------------------------------------


def _settings(args: argparse.Namespace) -> Settings:
    config: dict[str, Any] | None = None
    if getattr(args, "config_key", None) and not getattr(args, "config", None):
        raise UsageError("--config-key needs --config: the file whose block it names")
    if getattr(args, "config", None):
        config = load_config_file(args.config, getattr(args, "config_key", None))
    if getattr(args, "config_json", None):
        import json

        try:
            config = json.loads(args.config_json)
        except ValueError as exc:
            raise UsageError(f"--config-json is not JSON: {exc}") from None
        if not isinstance(config, dict):
            raise UsageError("--config-json must be a JSON object of config keys")
    settings = settings_from(config, cache_root=args.cache_root)
    if settings.shared_group is not None:
        from gpu_cache.jobenv.trust import share_with_group

        share_with_group()  # what warm/validate start writes group-writable entries
    return settings


@contextmanager
def _log_stream(path: str | None) -> Iterator[TextIO]:
    if path is None:
        yield sys.stderr
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as stream:
        yield stream


def _dumps(report: Any, compact: bool = False) -> str:
    """JSON text; ``compact`` for reports that grow with the cache (a prune of a million
    entries lists each one): no indentation, so the C encoder writes it, ten times faster."""
    import json  # (deferred: `gpu-cache env`, run at every Snakemake start, needs no JSON)

    if compact:
        return json.dumps(report, separators=(",", ":"), default=str) + "\n"
    return json.dumps(report, indent=2, default=str) + "\n"


def _emit(report: dict[str, Any], output: str | None, to_stdout: bool = True,
          compact: bool = False) -> None:
    text = _dumps(report, compact)
    if output:
        _write_text(Path(output), text)
    if to_stdout:
        sys.stdout.write(text)


def _write_text(target: Path, text: str) -> None:
    """Write ``text`` to the output ``target`` without ever replacing what it names, unless
    that is a regular file (:func:`gpu_cache.core.safe_io.write_output`): a regular file or a new
    path goes through a temporary file beside it and a rename; a symlink is followed; a
    character device or FIFO is written to; a folder, socket or block device is refused
    (exit 2); a FIFO that nobody reads is refused (exit 1)."""
    from gpu_cache.core.safe_io import write_output

    write_output(target, text, what="--output")


def _gpu_type(settings: Settings, requested: str | None) -> str:
    from gpu_cache.config.targets import GPU_TYPE_NAME, gpu_types

    if requested is not None and not GPU_TYPE_NAME.fullmatch(requested):
        raise UsageError(f"--gpu-type {requested!r}: a GPU type is letters, digits, '.', '_' and '-'")
    return requested or next(iter(gpu_types(settings)))


# --- one handler per subcommand --------------------------------------------------------


def _env(args: argparse.Namespace) -> int:
    from gpu_cache.jobenv import env

    exports = env.resolve(_settings(args))
    if args.json:
        sys.stdout.write(_dumps(exports.as_dict()))
    else:
        # The bytes of each path as they are on disk, also when they are not UTF-8.
        sys.stdout.flush()
        sys.stdout.buffer.write(env.shell_lines(exports).encode("utf-8", "surrogateescape"))
        sys.stdout.buffer.flush()
        env.warn_once(exports, environ={})
    return 0


def _warm(args: argparse.Namespace) -> int:
    from gpu_cache.commands.warm import warm

    settings = _settings(args)
    gpu_type = _gpu_type(settings, args.gpu_type)
    with _log_stream(args.log) as output:
        report = warm(settings, gpu_type, output)
    for line in report.broken:
        _warn("%s", line)
    _emit(report.as_dict(), args.output, to_stdout=args.output is None)
    return 0


def _validate(args: argparse.Namespace) -> int:
    from gpu_cache.commands.validate import judge_phases, remember, run_phases
    from gpu_cache.jobenv import env

    settings = _settings(args)
    gpu_type = _gpu_type(settings, args.gpu_type)
    exports = env.resolve(settings)
    if args.phases:
        phases = _load_phases(Path(args.phases))
    else:
        env.warn_once(exports)
        with _log_stream(args.log) as output:
            phases = run_phases(settings, gpu_type, output, env.job_environ(exports))
    verdict = judge_phases(settings, gpu_type, phases, exports)
    remember(settings, verdict, phases["validate"])
    _emit(verdict.as_dict(), args.output, to_stdout=args.output is None)
    if verdict.outcome == "unscheduled":  # an optional type: not a failure, also when strict
        for problem in verdict.problems:
            print(f"gpu-cache: {gpu_type} {problem}", file=sys.stderr)
    elif not verdict.passed:
        for problem in verdict.problems:
            print(f"gpu-cache: validation of {gpu_type} failed: {problem}", file=sys.stderr)
        if settings.validate.strict:
            return 1
    return 0


def _load_phases(path: Path) -> dict[str, Any]:
    """The validation passes the workload runner wrote (a mapping of phase to result, or
    one validate pass)."""
    from gpu_cache.core.reports import PhaseResult
    from gpu_cache.core.safe_io import load_json

    data = load_json(path)
    try:
        if isinstance(data, dict) and "validate" in data:
            return {name: None if value is None else PhaseResult.from_dict(value)
                    for name, value in data.items()}
        return {"validate": PhaseResult.from_dict(data)}
    except UsageError as exc:
        raise UsageError(f"{path}: {exc}") from None


def _prune(args: argparse.Namespace) -> int:
    with kinds.no_cyclic_gc():  # millions of objects and no cycles
        return _prune_now(args)


def _prune_now(args: argparse.Namespace) -> int:
    from gpu_cache.commands.prune import prune
    from gpu_cache.config.units import parse_age, parse_size

    settings = _settings(args)
    try:
        max_size = parse_size(args.max_size) if args.max_size is not None else settings.prune.max_size
    except UsageError as exc:
        raise UsageError(f"--max-size: {exc}") from None
    try:
        max_age = parse_age(args.max_age) if args.max_age is not None else settings.prune.max_age_seconds
    except UsageError as exc:
        raise UsageError(f"--max-age: {exc}") from None
    report = prune(settings, max_size=max_size, max_age=max_age,
                   dry_run=args.dry_run or settings.prune.dry_run,
                   only=tuple(args.kind or kinds.PRUNABLE), strict_root=not args.no_fail)
    _emit(report.as_dict(), args.output, to_stdout=args.json, compact=True)
    if not args.json:
        sys.stdout.write(_removed_lines(report))
    for line in report.problems:
        _warn("prune: %s", line)
    for line in report.software_mismatches:
        _warn("software mismatch: %s", line)
    return 1 if report.software_mismatches and settings.validate.strict else 0


def _removed_lines(report: Any, shown: int = 20) -> str:
    """What a prune removed (or would remove), an entry a line, ``shown`` per kind at most."""
    from gpu_cache.config.units import format_size

    verb = "would remove" if report.dry_run else "removed"
    lines = []
    parts = [(kind, part) for kind, part in report.kinds.items()]
    parts += [(f"local tier {kind}", part) for kind, part in report.tier.items()]
    for kind, part in parts:
        for entry in part.removed[:shown]:
            lines.append(f"{verb} {kind} {entry['key']} ({entry['name']}, "
                         f"{format_size(entry['bytes'])}): {entry['reason']}")
        if len(part.removed) > shown:
            lines.append(f"{verb} {len(part.removed) - shown} more {kind} entries (--json lists all)")
    return "".join(f"{line}\n" for line in lines)


def _stats(args: argparse.Namespace) -> int:
    with kinds.no_cyclic_gc():  # millions of objects and no cycles
        return _stats_now(args)


def _stats_now(args: argparse.Namespace) -> int:
    from gpu_cache.commands import stats
    from gpu_cache.jobenv.fs import require_folder_or_missing

    settings = _settings(args)
    if settings.cache_root is not None:
        require_folder_or_missing(settings.cache_root)
    report = stats.cache_stats(settings)
    sys.stdout.write(_dumps(report, compact=True) if args.json else stats.render(report))
    return 0


def _doctor(args: argparse.Namespace) -> int:
    if args.explain:
        return _explain(args)
    from gpu_cache.commands import doctor

    settings = _settings(args)
    report = doctor.preflight(settings)
    if args.fix and settings.cache_root is not None and settings.cache_root.is_dir():
        from gpu_cache.commands.prune import repair

        fixed = repair(settings)
        report["fixed"] = {kind: vars(fixed.kinds[kind]) for kind in kinds.PRUNABLE}
        report["warnings"] += fixed.problems
    if args.output:
        _emit(report, args.output, to_stdout=False)
    sys.stdout.write(_dumps(report) if args.json else doctor.render(report))
    return 0 if report["ok"] or args.no_fail else 1


def _explain(args: argparse.Namespace) -> int:
    from gpu_cache.commands import explain

    settings = _settings(args)
    if settings.cache_root is None:
        raise UsageError("--explain needs a cache root (caching is turned off)")
    report = explain.account_cache(settings.cache_root, args.run_id)
    if args.output:
        _emit(report, args.output, to_stdout=False)
    sys.stdout.write(_dumps(report) if args.json else explain.render_account(report))
    return 0


def _summary(args: argparse.Namespace) -> int:
    from gpu_cache.commands import summary

    validations = [Path(p) for p in args.validate]
    text = summary.render(validations, Path(args.prune) if args.prune else None)
    if args.output:
        _write_text(Path(args.output), text)
    sys.stdout.write(text)
    # A type whose workloads could not even start is an error at the end of the run, not a
    # quiet "FAILED" line (every host job still ran: they only missed their warm cache).
    failed = summary.errors(validations)
    for line in failed:
        print(f"gpu-cache: ERROR: {line}", file=sys.stderr)
    return 1 if failed else 0


def _plots(args: argparse.Namespace) -> int:
    from gpu_cache.commands import plots, stats

    settings = _settings(args)
    by_rule = stats.usage(settings.cache_root)["by_rule"] if settings.cache_root else {}
    written = plots.write_plots([Path(p) for p in args.validate],
                                 Path(args.prune) if args.prune else None, by_rule, Path(args.outdir))
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def _trusted_tier(settings: Any) -> Path | None:
    """This node's local tier of the cache root when it exists and is trusted (issue 23);
    one that is not is left out, with a warning (its entries could be anyone's)."""
    from gpu_cache.jobenv import env, trust

    local = env.tier_folder(settings)
    if local is None or not local.is_dir():
        return None
    why = trust.distrust(local, settings.shared_group, env.tier_trusted_above(settings))
    if why:
        _warn("local tier left out: %s", why)
        return None
    return local


def _pack(args: argparse.Namespace) -> int:
    from gpu_cache import carry

    settings = _settings(args)
    if settings.cache_root is None:
        raise UsageError("pack needs a cache root (caching is turned off)")
    matcher = carry.workload_matcher(settings, args.workload) if args.workload else None
    report = carry.pack(root=settings.cache_root, archive=Path(args.archive), kinds=args.kind,
                        gpu_type=args.gpu_type, workload=args.workload, matcher=matcher,
                        tier=_trusted_tier(settings))
    sys.stdout.write(_dumps(report.as_dict(), False) if args.json else carry.render_pack(report))
    return 0


def _unpack(args: argparse.Namespace) -> int:
    from gpu_cache import carry

    settings = _settings(args)
    try:
        report = carry.unpack(root=settings.cache_root, archive=Path(args.archive), kinds=args.kind,
                              gpu_type=args.gpu_type, python=args.python, image=args.image,
                              force=args.force, dry_run=args.dry_run, shared_group=settings.shared_group)
    except carry.Refused as exc:  # a mismatch or an unsafe archive: one line, exit 1
        print(f"gpu-cache: error: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(_dumps(report.as_dict(), False) if args.json else carry.render_unpack(report))
    for line in report.failures():  # entries damaged in the archive: never a success
        print(f"gpu-cache: error: {line}", file=sys.stderr)
    return 1 if report.damaged else 0


def _install_profile(args: argparse.Namespace) -> int:
    from gpu_cache.profile import install_profile

    target = install_profile(args.name, Path(args.target) if args.target else None, args.force)
    print(f"installed profile {args.name} in {target}; use it with: snakemake --profile {args.name}")
    return 0


def _no_command(names: list[str]) -> int:
    raise UsageError(f"no command given; commands: {', '.join(names)} (see `gpu-cache --help`)")


# --- the parser ------------------------------------------------------------------------


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cache-root", metavar="DIR",
                        help="cache root (default: config, $GPU_CACHE_ROOT, $XDG_CACHE_HOME/gpu-cache, "
                             "~/.cache/gpu-cache); 'none' turns caching off")
    parser.add_argument("--config", metavar="FILE",
                        help="YAML or JSON config (same keys as the workflow's), or a host pipeline's "
                             "config: then its gpu_cache: block")
    parser.add_argument("--config-key", metavar="KEY",
                        help="with --config: the top-level key of the block that holds gpu-cache's "
                             "config in a host's file (default: gpu_cache, where there is one)")
    parser.add_argument("--config-json", metavar="JSON", help=argparse.SUPPRESS)  # from the rules


def _command(sub: Any, name: str, handler: Handler, about: str,
             common: bool = True) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(name, help=about, description=about)
    parser.set_defaults(handler=handler)
    if common:
        _add_common(parser)
    return parser


def build_parser() -> argparse.ArgumentParser:
    """The ``gpu-cache`` argument parser; each subcommand sets its ``handler``."""
    parser = _Parser(prog="gpu-cache", description="Warm, validate, prune and observe JIT compile caches.")
    parser.add_argument("--version", action="version", version=f"gpu-cache {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    parser.set_defaults(handler=lambda _args: _no_command(list(sub.choices)))

    p = _command(sub, "env", _env, "print the cache environment as shell lines (eval \"$(gpu-cache env)\")")
    p.add_argument("--json", action="store_true", help="print JSON instead")

    for name, handler, about in (
            ("warm", _warm, "run the workloads of a GPU type with the cache environment"),
            ("validate", _validate, "re-run them in fresh processes and judge the cache")):
        p = _command(sub, name, handler, about)
        p.add_argument("--gpu-type", help="GPU type to work on (default: this machine's)")
        p.add_argument("--output", metavar="FILE", help="write the JSON report here (default: stdout)")
        p.add_argument("--log", metavar="FILE", help="append the workloads' output here (default: stderr)")
        if name == "validate":
            p.add_argument("--phases", metavar="FILE",
                           help="judge the passes the workload runner ran in the jobs' software "
                                "(the workflow's check_cache output) instead of running them here")

    p = _command(sub, "prune", _prune, "remove broken, old and least recently used entries")
    p.add_argument("--max-size", help="largest size per kind, like 10G (default: config, 10G)")
    p.add_argument("--max-age", help="remove entries unused for longer, like 30d (default: config, 30d)")
    p.add_argument("--kind", action="append", metavar="KIND",
                   help=f"prune only this kind ({', '.join(kinds.PRUNABLE)}); repeatable")
    p.add_argument("--dry-run", action="store_true", help="report what would go; delete nothing")
    p.add_argument("--json", action="store_true", help="print the JSON report")
    p.add_argument("--output", metavar="FILE", help="also write the JSON report here")
    p.add_argument("--no-fail", action="store_true",
                   help="a cache root that is a file or a broken link is reported in the JSON, "
                        "exit 0 (the workflow's prune rule uses this)")

    p = _command(sub, "stats", _stats, "entries, bytes, ages and hit rates per kind")
    p.add_argument("--json", action="store_true", help="print JSON instead")

    p = _command(sub, "doctor", _doctor, "preflight checks of the cache folders")
    p.add_argument("--json", action="store_true", help="print JSON instead")
    p.add_argument("--output", metavar="FILE", help="also write the JSON report here")
    p.add_argument("--no-fail", action="store_true", help="exit 0 even when a cache is unusable")
    p.add_argument("--explain", action="store_true",
                   help="account for every miss `gpu-cache stats` counts, by rule and cause, and "
                        "explain why computations missed: diff their cache-key parts against "
                        "earlier runs' (from the stats hook's records)")
    p.add_argument("--run-id", help="with --explain: the run whose misses to explain "
                                    "(default: every record; key by key, the latest that missed)")
    p.add_argument("--fix", action="store_true",
                   help="also remove broken entries (empty or truncated JAX entries, orphan halves, "
                        "stale temporaries), as prune does, keeping every good one")

    p = _command(sub, "summary", _summary, "summarise validation and prune reports", common=False)
    p.add_argument("--validate", nargs="*", default=[], metavar="FILE", help="validate/{gpu_type}.json files")
    p.add_argument("--prune", metavar="FILE", help="prune.json")
    p.add_argument("--output", metavar="FILE", help="also write the summary here")

    p = _command(sub, "plots", _plots, "write the report's SVG plots (cold vs warm, cache size, hit rates)")
    p.add_argument("--validate", nargs="*", default=[], metavar="FILE", help="validate/{gpu_type}.json files")
    p.add_argument("--prune", metavar="FILE", help="prune.json")
    p.add_argument("--outdir", required=True, metavar="DIR", help="folder for the .svg files")

    p = _command(sub, "pack", _pack, "write warmed cache entries into one archive, with a manifest")
    p.add_argument("archive", metavar="ARCHIVE", help="the archive to write: .tar, .tar.gz/.tgz, "
                                                      ".tar.xz/.txz or .tar.bz2/.tbz2")
    p.add_argument("--kind", action="append", metavar="KIND",
                   help=f"pack this kind ({', '.join(kinds.CARRIED)}); repeatable (default: all)")
    p.add_argument("--gpu-type", help="only the entries this GPU type's warm and validate passes "
                                      "used (from the records)")
    p.add_argument("--workload", help="only the entries this workload's warm and validate passes "
                                      "used (from the records)")
    p.add_argument("--json", action="store_true", help="print a JSON report")

    p = _command(sub, "unpack", _unpack, "check an archive against this target and add its entries "
                                         "to the cache; exit 1 when refused")
    p.add_argument("archive", metavar="ARCHIVE", help="an archive written by `gpu-cache pack`")
    p.add_argument("--kind", action="append", metavar="KIND",
                   help=f"unpack only this kind ({', '.join(kinds.CARRIED)}); repeatable "
                        "(default: all in it)")
    p.add_argument("--gpu-type", help="the GPU type the entries are for: JAX entries must have been "
                                      "compiled on it, Triton ones for its compute capability")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--python", metavar="PY", help="the jobs' Python (run to learn its jax, "
                                                       "triton and Python versions; default: this one)")
    target.add_argument("--image", metavar="IMAGE", help="the jobs' container image (run with "
                                                         "apptainer where there is one, else its name "
                                                         "is compared)")
    p.add_argument("--force", action="store_true", help="unpack even when the archive does not fit")
    p.add_argument("--dry-run", action="store_true", help="check and report; write nothing")
    p.add_argument("--json", action="store_true", help="print a JSON report")

    from gpu_cache.commands import fetch, publish  # each owns its arguments (issue 33's shape)

    for module in (publish, fetch):
        run = module.run
        module.add_arguments(_command(sub, module.NAME, lambda args, run=run: run(args, _settings(args)),
                                      module.ABOUT))

    p = _command(sub, "install-profile", _install_profile,
                 "install the Snakemake profile (--profile gpu-cache)", common=False)
    p.add_argument("--name", default="gpu-cache", help="shipped profile to install (default: gpu-cache)")
    p.add_argument("--target", metavar="DIR", help="folder to install into "
                                                   "(default: $XDG_CONFIG_HOME/snakemake/<name>)")
    p.add_argument("--force", action="store_true", help="replace an existing, different profile")
    p.add_argument("--cache-root", help=argparse.SUPPRESS)
    return parser


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
        args = build_parser().parse_args(argv)
        handler: Handler = args.handler
        return handler(args)
    except UsageError as exc:
        print(f"gpu-cache: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        print(f"gpu-cache: error:{where}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("gpu-cache: interrupted", file=sys.stderr)
        return 130
