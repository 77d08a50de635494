"""The ``gpu-cache`` command line. Bad input: one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, TextIO

from gpu_cache import __version__
from gpu_cache.entries import PRUNABLE_KINDS
from gpu_cache.errors import UsageError
from gpu_cache.fs import require_folder_or_missing
from gpu_cache.settings import Settings, load_config_file, settings_from
from gpu_cache.units import parse_age, parse_size


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse would print the whole usage
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cache-root", metavar="DIR",
                        help="cache root (default: config, $GPU_CACHE_ROOT, $XDG_CACHE_HOME/gpu-cache, "
                             "~/.cache/gpu-cache); 'none' turns caching off")
    parser.add_argument("--config", metavar="FILE", help="YAML or JSON config (same keys as the workflow's)")
    parser.add_argument("--config-json", metavar="JSON", help=argparse.SUPPRESS)  # from the rules


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gpu-cache", description="Warm, validate, prune and observe JIT compile caches.")
    parser.add_argument("--version", action="version", version=f"gpu-cache {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("env", help="print the cache environment as shell lines (eval \"$(gpu-cache env)\")")
    _add_common(p)
    p.add_argument("--json", action="store_true", help="print JSON instead")

    for name, about in (("warm", "run the workloads of a GPU type with the cache environment"),
                        ("validate", "re-run them in fresh processes and judge the cache")):
        p = sub.add_parser(name, help=about)
        _add_common(p)
        p.add_argument("--gpu-type", help="GPU type to work on (default: this machine's)")
        p.add_argument("--output", metavar="FILE", help="write the JSON report here (default: stdout)")
        p.add_argument("--log", metavar="FILE", help="append the workloads' output here (default: stderr)")

    p = sub.add_parser("prune", help="remove broken, old and least recently used entries")
    _add_common(p)
    p.add_argument("--max-size", help="largest size per kind, like 10G (default: config, 10G)")
    p.add_argument("--max-age", help="remove entries unused for longer, like 30d (default: config, 30d)")
    p.add_argument("--kind", action="append", metavar="KIND",
                   help="prune only this kind (jax, triton); repeatable")
    p.add_argument("--dry-run", action="store_true", help="report what would go; delete nothing")
    p.add_argument("--json", action="store_true", help="print the JSON report")
    p.add_argument("--output", metavar="FILE", help="also write the JSON report here")
    p.add_argument("--no-fail", action="store_true",
                   help="a cache root that is a file or a broken link is reported in the JSON, "
                        "exit 0 (the workflow's prune rule uses this)")

    p = sub.add_parser("stats", help="entries, bytes, ages and hit rates per kind")
    _add_common(p)
    p.add_argument("--json", action="store_true", help="print JSON instead")

    p = sub.add_parser("doctor", help="preflight checks of the cache folders")
    _add_common(p)
    p.add_argument("--json", action="store_true", help="print JSON instead")
    p.add_argument("--output", metavar="FILE", help="also write the JSON report here")
    p.add_argument("--no-fail", action="store_true", help="exit 0 even when a cache is unusable")
    p.add_argument("--explain", action="store_true",
                   help="explain why JAX computations missed: diff their cache-key parts against "
                        "earlier runs' (from the stats hook's records)")
    p.add_argument("--run-id", help="with --explain: the run whose misses to explain "
                                    "(default: the latest process that missed)")
    p.add_argument("--fix", action="store_true",
                   help="also remove broken entries (empty or truncated JAX entries, orphan halves, "
                        "stale temporaries), as prune does, keeping every good one")

    p = sub.add_parser("summary", help="summarise validation and prune reports")
    p.add_argument("--validate", nargs="*", default=[], metavar="FILE", help="validate/{gpu_type}.json files")
    p.add_argument("--prune", metavar="FILE", help="prune.json")
    p.add_argument("--output", metavar="FILE", help="also write the summary here")

    p = sub.add_parser("plots", help="write the report's SVG plots (cold vs warm, cache size, hit rates)")
    _add_common(p)
    p.add_argument("--validate", nargs="*", default=[], metavar="FILE", help="validate/{gpu_type}.json files")
    p.add_argument("--prune", metavar="FILE", help="prune.json")
    p.add_argument("--outdir", required=True, metavar="DIR", help="folder for the .svg files")

    p = sub.add_parser("install-profile", help="install the Snakemake profile (--profile gpu-cache)")
    p.add_argument("--name", default="gpu-cache", help="shipped profile to install (default: gpu-cache)")
    p.add_argument("--target", metavar="DIR", help="folder to install into "
                                                   "(default: $XDG_CONFIG_HOME/snakemake/<name>)")
    p.add_argument("--force", action="store_true", help="replace an existing, different profile")
    p.add_argument("--cache-root", help=argparse.SUPPRESS)
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    config: dict[str, Any] | None = None
    if getattr(args, "config", None):
        config = load_config_file(args.config)
    if getattr(args, "config_json", None):
        try:
            config = json.loads(args.config_json)
        except ValueError as exc:
            raise UsageError(f"--config-json is not JSON: {exc}") from None
    settings = settings_from(config, cache_root=args.cache_root)
    if settings.shared_group is not None:
        from gpu_cache.trust import share_with_group

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


def _emit(report: dict[str, Any], output: str | None, to_stdout: bool = True) -> None:
    text = json.dumps(report, indent=2, default=str) + "\n"
    if output:
        target = Path(output)
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.with_name(f".{target.name}.tmp")
        temp.write_text(text)
        os.replace(temp, target)
    if to_stdout:
        sys.stdout.write(text)


def _gpu_type(settings: Settings, requested: str | None) -> str:
    from gpu_cache.targets import gpu_types

    if requested:
        return requested
    return next(iter(gpu_types(settings)))


def _run(args: argparse.Namespace) -> int:
    if args.command == "env":
        from gpu_cache import env

        exports = env.resolve(_settings(args))
        if args.json:
            sys.stdout.write(json.dumps(exports.as_dict(), indent=2) + "\n")
        else:
            sys.stdout.write(env.shell_lines(exports))
            for line in exports.messages():
                print(f"gpu-cache: warning: {line}", file=sys.stderr)
        return 0
    if args.command in ("warm", "validate"):
        from gpu_cache.validate import validate
        from gpu_cache.warm import warm

        settings = _settings(args)
        gpu_type = _gpu_type(settings, args.gpu_type)
        with _log_stream(args.log) as log:
            report = (warm if args.command == "warm" else validate)(settings, gpu_type, log)
        _emit(report, args.output, to_stdout=args.output is None)
        if args.command == "validate" and not report["passed"]:
            for problem in report["problems"]:
                print(f"gpu-cache: validation of {gpu_type} failed: {problem}", file=sys.stderr)
            if settings.config["validate"]["strict"]:
                return 1
        return 0
    if args.command == "prune":
        from gpu_cache.prune import prune

        settings = _settings(args)
        limits = settings.config["prune"]
        try:
            max_size = parse_size(args.max_size if args.max_size is not None else limits["max_size"])
            max_age = parse_age(args.max_age if args.max_age is not None else limits["max_age"])
        except UsageError as exc:
            raise UsageError(f"--max-size/--max-age: {exc}") from None
        report = prune(
            settings, max_size=max_size, max_age=max_age,
            dry_run=args.dry_run or limits["dry_run"],
            kinds=tuple(args.kind or PRUNABLE_KINDS),
            strict_root=not args.no_fail,
        )
        _emit(report, args.output, to_stdout=args.json)
        return 0
    if args.command == "stats":
        from gpu_cache import stats

        settings = _settings(args)
        if settings.cache_root is not None:
            require_folder_or_missing(settings.cache_root)
        report = stats.cache_stats(settings)
        sys.stdout.write(json.dumps(report, indent=2) + "\n" if args.json else stats.render(report))
        return 0
    if args.command == "doctor" and args.explain:
        from gpu_cache import explain

        settings = _settings(args)
        if settings.cache_root is None:
            raise UsageError("--explain needs a cache root (caching is turned off)")
        explanations = explain.explain_cache(settings.cache_root, args.run_id)
        if args.output:
            _emit({"explain": explanations}, args.output, to_stdout=False)
        sys.stdout.write(json.dumps(explanations, indent=2) + "\n" if args.json
                         else explain.render(explanations))
        return 0
    if args.command == "doctor":
        from gpu_cache import doctor

        settings = _settings(args)
        report = doctor.preflight(settings)
        if args.fix and settings.cache_root is not None and settings.cache_root.is_dir():
            from gpu_cache.prune import repair

            fixed = repair(settings)
            report["fixed"] = {kind: fixed[kind] for kind in PRUNABLE_KINDS}
            report["warnings"] += [str(p) for p in fixed["problems"]]
        if args.output:
            _emit(report, args.output, to_stdout=False)
        sys.stdout.write(json.dumps(report, indent=2) + "\n" if args.json else doctor.render(report))
        return 0 if report["ok"] or args.no_fail else 1
    if args.command == "summary":
        from gpu_cache import summary

        text = summary.render([Path(p) for p in args.validate], Path(args.prune) if args.prune else None)
        if args.output:
            Path(args.output).write_text(text)
        sys.stdout.write(text)
        return 0
    if args.command == "plots":
        from gpu_cache import report, stats

        settings = _settings(args)
        usage = stats.usage(settings.cache_root) if settings.cache_root else {}
        try:
            written = report.write_plots([Path(p) for p in args.validate],
                                         Path(args.prune) if args.prune else None, usage, Path(args.outdir))
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot make the plots: {exc}") from None
        print("wrote " + ", ".join(str(p) for p in written))
        return 0
    if args.command == "install-profile":
        from gpu_cache.profile import install_profile

        target = install_profile(args.name, Path(args.target) if args.target else None, args.force)
        print(f"installed profile {args.name} in {target}; use it with: snakemake --profile {args.name}")
        return 0
    raise UsageError("no command given; commands: env, warm, validate, prune, stats, doctor, "
                     "install-profile (see `gpu-cache --help`)")


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    try:
        return _run(_build_parser().parse_args(argv))
    except UsageError as exc:
        print(f"gpu-cache: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gpu-cache: interrupted", file=sys.stderr)
        return 130
