"""Warm: run each workload of a GPU type once per shape, with the cache environment."""

from __future__ import annotations

import argparse
import os
from typing import TextIO

from gpu_cache.commands import common
from gpu_cache.config.settings import Settings
from gpu_cache.config.workloads import plan_phase
from gpu_cache.core import runner
from gpu_cache.core.reports import PhaseResult
from gpu_cache.jobenv import env


def warm(settings: Settings, gpu_type: str, output: TextIO) -> PhaseResult:
    """Warm the caches for ``gpu_type`` here, in this interpreter's software (the workloads'
    output goes to ``output``). The workflow instead runs the same plan in the GPU type's
    container or conda environment (``gpu_cache.core.runner``).

    Raises:
        UsageError: the GPU type or one of its workloads is unknown.
    """
    exports = env.resolve(settings)
    env.warn_once(exports)
    plan = runner.with_threads(plan_phase(settings, gpu_type, "warm"), os.cpu_count() or 1)
    result = runner.run_plan(plan, output, env.job_environ(exports))
    result.cache_warnings = exports.messages()
    result.cache_problems = [f"{kind}: {why}" for kind, why in exports.problems.items()]
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common.add_phase_arguments(parser)


def run(args: argparse.Namespace) -> int:
    settings = common.settings(args)
    gpu_type = common.gpu_type(settings, args.gpu_type)
    common.announce("warm", settings, gpu_type, "each run in a fresh process")
    with common.log_stream(args.log) as output:
        report = warm(settings, gpu_type, output)
    for line in report.broken:
        common.warn("%s", line)
    common.emit(report.as_dict(), args.output, to_stdout=args.output is None)
    return 0
