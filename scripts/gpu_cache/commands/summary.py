"""The short end-of-run summary: verdict, hits, misses, cold vs warm, cache size."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpu_cache import __version__
from gpu_cache.commands import common, outputs_proof
from gpu_cache.config.units import format_size
from gpu_cache.core import safe_io, software
from gpu_cache.core.errors import UsageError
from gpu_cache.core.shown import shown, shown_lines
from gpu_cache.reports import PruneReport, Verdict


def load_verdict(path: Path) -> Verdict:
    """Raises: UsageError: ``path`` cannot be read or is not a validation verdict."""
    try:
        return Verdict.from_dict(safe_io.load_json(path))
    except UsageError as exc:
        raise UsageError(f"{path}: {exc}") from None


def load_prune(path: Path) -> PruneReport:
    """Raises: UsageError: ``path`` cannot be read or is not a prune report."""
    try:
        return PruneReport.from_dict(safe_io.load_json(path))
    except UsageError as exc:
        raise UsageError(f"{path}: {exc}") from None


def errors(validations: list[Path]) -> list[str]:
    """One line per GPU type whose workloads could not even start (verdict status ``error``)
    or that was not warmed for a cause the user can fix (``not_warmed``): the run must not end
    as if the cache had been warmed.

    Raises:
        UsageError: a file cannot be read as a verdict.
    """
    found = []
    for path in validations:
        v = load_verdict(path)
        if v.outcome == "error":
            found.append(f"GPU type {v.gpu_type}: {v.problems[0] if v.problems else 'no workload ran'}")
        elif v.not_warmed:  # SLURM refused its job for a cause the config fixes (issue 49)
            found.append(f"GPU type {v.gpu_type}: not warmed: {v.not_warmed}")
    return found


def render(validations: list[Path], prune: Path | None) -> str:
    """A few lines per GPU type and one per cache kind.

    Raises:
        UsageError: a file cannot be read as JSON.
    """
    lines = [f"gpu-cache {__version__} summary"]
    for path in validations:
        v = load_verdict(path)
        if v.outcome == "unscheduled":
            lines.append(f"  {v.gpu_type}: UNSCHEDULED (optional type)")
            lines += [f"    note: {p}" for p in v.problems]
            continue
        if v.not_warmed:  # no job of it ran on its node: no figures to show
            lines.append(f"  {v.gpu_type}: FAILED: not warmed")
            lines += [f"    problem: {p}" for p in v.problems]
            continue
        cold = f"{v.cold_seconds:.1f} s" if v.cold_seconds is not None else "not measured"
        speedup = f" ({v.speedup:.1f}x)" if v.speedup else ""
        verdict = {"passed": "PASSED", "error": "ERROR"}.get(v.outcome, "FAILED")
        # What was validated: the image as configured and the jax that ran in it (#25).
        what = f"; validated {software.describe(v.software)}" if v.software else ""
        lines.append(f"  {v.gpu_type} on {v.device.get('name', '?')}: {verdict}: {v.hits} hits, "
                     f"{v.misses} misses, {v.new_entries} new entries; cold {cold}, "
                     f"warm {v.warm_seconds:.1f} s{speedup}{what}")
        proof = outputs_proof.described(v.outputs)
        if proof:  # issues 40, 47: what the cache was proven to compute
            fresh = outputs_proof.fresh_text(v.outputs)
            lines.append(f"    {proof} ({v.outputs.get('mode')}; reference: {v.outputs.get('reference')}"
                         f"{'; ' + fresh if fresh else ''})")
        lines += warm_lines(v)
        lines += [f"    problem: {p}" for p in v.problems]
    if prune is not None:
        p = load_prune(prune)
        verb = "would remove" if p.dry_run else "removed"
        for kind, k in p.kinds.items():
            lines.append(f"  {kind} cache: {format_size(k.bytes_after)} in {k.entries_after} "
                         f"entries after pruning ({verb} {k.entries_removed}, "
                         f"{format_size(k.bytes_removed)})")
        if p.tier:  # the node-local tier of the node that pruned (#23)
            kept = sum(k.bytes_after for k in p.tier.values())
            lines.append(f"  local tier of the pruning node: {format_size(kept)} in "
                         f"{sum(k.entries_after for k in p.tier.values())} entries (bound "
                         f"{format_size(p.tier_max_size)}; {verb} "
                         f"{sum(k.entries_removed for k in p.tier.values())}) in {p.tier_folder}")
        if p.references is not None and p.references.entries_before:  # issue 40: cold passes' outputs
            r = p.references
            lines.append(f"  outputs references: {format_size(r.bytes_after)} in {r.entries_after} after "
                         f"pruning, within max_size {format_size(p.max_size)} as each kind ({verb} "
                         f"{r.entries_removed}, {format_size(r.bytes_removed)})")
        lines += [f"    prune: {problem}" for problem in p.problems]
        lines += [f"  software mismatch: {line}" for line in p.software_mismatches]
    return shown_lines(lines)


def warm_lines(v: Verdict) -> list[str]:
    """What the run's warm passes did that the validation's counts do not show: the entries
    re-made (no warm had compiled their bytes), and what a check job warmed first and why."""
    lines = []
    if v.remade:
        count = sum(len(keys) for keys in v.remade.values())
        each = ", ".join(f"{kind} {len(keys)}" for kind, keys in sorted(v.remade.items()))
        lines.append(f"    re-made {_entries(count)} no warm had compiled ({each}): set aside and compiled "
                     "again by the warm, whose outputs are their reference now")
    if v.warmed_again:
        again = v.warmed_again
        lines.append(f"    the check job warmed again first ({again.get('new_entries')} new entries): "
                     f"{again.get('why')}")
    return lines


def _entries(count: object) -> str:
    return f"{count} entry" if count == 1 else f"{count} entries"


#: Where a run of the workflow in this folder leaves its reports (workflow/rules/cache.smk).
RESULTS = Path("results") / "gpu-cache"


def found_here() -> tuple[list[Path], Path | None]:
    """The verdicts and prune report a run of the workflow left in this folder.

    Raises:
        UsageError: there are none.
    """
    validations = sorted((RESULTS / "validate").glob("*.json"))
    if not validations:
        raise UsageError(f"no verdicts here ({RESULTS / 'validate'}/*.json): run the workflow in "
                         "this folder first, or name them with --validate")
    prune = RESULTS / "prune.json"
    return validations, prune if prune.is_file() else None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common.add_report_inputs(parser)
    parser.add_argument("--output", metavar="FILE", help="also write the summary here")


def run(args: argparse.Namespace) -> int:
    validations = [Path(p) for p in args.validate]
    prune = Path(args.prune) if args.prune else None
    if not validations and prune is None:  # those of a run in this folder
        validations, prune = found_here()
    text = render(validations, prune)
    if args.output:
        common.write_text(Path(args.output), text)
    sys.stdout.write(text)
    # A type whose workloads could not even start is an error at the end of the run, not a
    # quiet "FAILED" line (every host job still ran: they only missed their warm cache).
    failed = errors(validations)
    for line in failed:
        print(shown(f"gpu-cache: ERROR: {line}"), file=sys.stderr)
    return 1 if failed else 0
