"""Plots for the Snakemake report, as self-contained SVG (no plotting library needed).

Three charts: cold vs warm seconds per GPU type and workload (from the validation
verdicts), cache size per kind before and after pruning (from prune.json), and hit rates
per rule (from the stats hook's records).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from html import escape
from pathlib import Path

from gpu_cache.commands import common, outputs_proof
from gpu_cache.commands.summary import load_prune, load_verdict
from gpu_cache.config.units import format_size
from gpu_cache.core.errors import UsageError
from gpu_cache.core.safe_io import write_output
from gpu_cache.reports import PruneReport, Usage, Verdict

#: Colours of the series, in order (colour-blind safe: Okabe-Ito).
COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7")
_BAR, _LEFT, _RIGHT, _TOP = 13, 230, 290, 64


def bar_chart(title: str, rows: list[str], series: dict[str, list[float]],
              labels: dict[str, list[str]], width: int = 920) -> str:
    """A horizontal grouped bar chart: one group per row, one bar per series, each bar
    labelled with its text from ``labels``. Returns the SVG document."""
    height = _TOP + max(1, len(rows)) * (len(series) * (_BAR + 3) + 14) + 24
    peak = max([v for values in series.values() for v in values] + [1e-9])
    plot_width = width - _LEFT - _RIGHT
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" font-size="13">',
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="12" y="24" font-size="16" font-weight="bold">{escape(title)}</text>']
    for number, name in enumerate(series):
        x = _LEFT + number * 170
        out.append(f'<rect x="{x}" y="36" width="12" height="12" fill="{COLOURS[number % len(COLOURS)]}"/>'
                   f'<text x="{x + 18}" y="47">{escape(name)}</text>')
    if not rows:
        out.append(f'<text x="{_LEFT}" y="{_TOP + 24}" fill="#555">no data recorded yet</text>')
    y = _TOP
    for index, row in enumerate(rows):
        group = len(series) * (_BAR + 3)
        out.append(f'<text x="{_LEFT - 8}" y="{y + group / 2 + 4:.0f}" text-anchor="end">'
                   f'{escape(row)}</text>')
        for number, (name, values) in enumerate(series.items()):
            value = values[index]
            bar = max(1.0, plot_width * value / peak) if value > 0 else 0.0
            by = y + number * (_BAR + 3)
            out.append(f'<rect x="{_LEFT}" y="{by}" width="{bar:.1f}" height="{_BAR}" '
                       f'fill="{COLOURS[number % len(COLOURS)]}"/>')
            out.append(f'<text x="{_LEFT + bar + 5:.1f}" y="{by + _BAR - 2}" font-size="12">'
                       f'{escape(labels[name][index])}</text>')
        y += group + 14
    out.append(f'<line x1="{_LEFT}" y1="{_TOP - 6}" x2="{_LEFT}" y2="{y - 8}" stroke="#333"/>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def cold_warm_chart(verdicts: list[Verdict]) -> str:
    """Cold (no cache) vs warm (fresh process, warmed cache) seconds per GPU type and
    workload, summed over each workload's shapes."""
    cold: dict[str, float] = defaultdict(float)
    warm: dict[str, float] = defaultdict(float)
    for verdict in verdicts:
        for runs, into in ((verdict.cold_runs, cold), (verdict.runs, warm)):
            for run in runs:
                into[f"{verdict.gpu_type} / {run.workload}"] += run.seconds
    rows = sorted(set(cold) | set(warm))
    values = {"cold (no cache)": [cold.get(r, 0.0) for r in rows],
              "warm (cache)": [warm.get(r, 0.0) for r in rows]}
    labels = {name: [f"{v:.1f} s" for v in vals] for name, vals in values.items()}
    proofs = {f"{v.gpu_type} / {run.workload}": outputs_proof.described(v.outputs, run.workload)
              for v in verdicts for run in v.runs}
    for index, row in enumerate(rows):
        if cold.get(row) and warm.get(row):
            labels["warm (cache)"][index] += f"  ({cold[row] / warm[row]:.1f}x faster)"
        if proofs.get(row):  # issue 40: what the warm cache was proven to compute
            labels["warm (cache)"][index] += f"  {proofs[row]}"
    return bar_chart("Cold vs warm start, per GPU type / workload", rows, values, labels)


def cache_size_chart(prune: PruneReport | None) -> str:
    """Bytes per cache kind before and after pruning."""
    by_kind = prune.kinds if prune else {}
    rows = list(by_kind)
    values = {"before pruning": [float(k.bytes_before) for k in by_kind.values()],
              "after pruning": [float(k.bytes_after) for k in by_kind.values()]}
    labels = {"before pruning": [f"{format_size(k.bytes_before)}, {k.entries_before} entries"
                                 for k in by_kind.values()],
              "after pruning": [f"{format_size(k.bytes_after)}, {k.entries_removed} removed"
                                + (" (dry run)" if k.dry_run else "") for k in by_kind.values()]}
    return bar_chart("Cache size per kind", rows, values, labels)


def hit_rate_chart(by_rule: dict[str, Usage]) -> str:
    """Hit rate (hits / (hits + misses), all observed kinds together) per rule."""
    rows = sorted(by_rule)
    rates, labels = [], []
    for rule in rows:
        u = by_rule[rule]
        rates.append(100.0 * (u.hit_rate or 0.0))
        labels.append(f"{rates[-1]:.0f}%  ({u.total_hits} hits, {u.total_misses} misses, "
                      f"{u.processes} process{'es' if u.processes != 1 else ''})")
    return bar_chart("Cache hit rate per rule", rows, {"hit rate": rates}, {"hit rate": labels})


def write_plots(verdict_paths: list[Path], prune_path: Path | None, by_rule: dict[str, Usage],
                outdir: Path) -> list[Path]:
    """Write cold_warm.svg, cache_size.svg and hit_rates.svg into ``outdir``.

    Each plot is written as :func:`gpu_cache.core.safe_io.write_output` writes an output: a
    regular file is replaced through a temporary file and a rename, a symlink is followed, a
    device or FIFO is written to, never replaced.

    Raises:
        UsageError: a verdict or prune.json cannot be read or is not such a report, or
            ``outdir`` (or a plot's name in it) is not something a file can be written to.
        OSError: a plot cannot be written.
    """
    verdicts = [load_verdict(p) for p in verdict_paths]
    prune = load_prune(prune_path) if prune_path else None
    try:
        outdir.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise UsageError(f"--outdir {outdir} is not a folder") from None
    charts = {"cold_warm.svg": cold_warm_chart(verdicts),
              "cache_size.svg": cache_size_chart(prune),
              "hit_rates.svg": hit_rate_chart(by_rule)}
    written = []
    for name, svg in charts.items():
        write_output(outdir / name, svg, what="plot")
        written.append(outdir / name)
    return written


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common.add_report_inputs(parser)
    parser.add_argument("--outdir", required=True, metavar="DIR", help="folder for the .svg files")


def run(args: argparse.Namespace) -> int:
    from gpu_cache.commands import stats

    settings = common.settings(args)
    by_rule = stats.usage(settings.cache_root)["by_rule"] if settings.cache_root else {}
    written = write_plots([Path(p) for p in args.validate],
                          Path(args.prune) if args.prune else None, by_rule, Path(args.outdir))
    print("wrote " + ", ".join(str(p) for p in written))
    return 0
