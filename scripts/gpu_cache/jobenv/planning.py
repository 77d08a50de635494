"""Whether the Snakemake process that parses the workflow will run any job at all.

A dry run (``-n``), ``--lint``, ``--list-rules``, ``--dag`` and the like only plan: they must
change nothing on disk, so the parse-time export (which probes, and so creates, every cache
folder) is skipped there. Snakemake knows a dry run only once the workflow is parsed (its
``workflow.dryrun`` is false at parse time), so this reads the options of the ``snakemake``
command line that is parsing, from the caller's stack. Through Snakemake's Python API (no
command line) a run counts as a real one.
"""

from __future__ import annotations

import sys
from types import FrameType

#: Options of Snakemake's command line (their argparse names) that parse the workflow but
#: run no job.
PLANNING_OPTIONS = (
    "dryrun", "lint", "list_rules", "list_target_rules", "print_compilation", "dag",
    "rulegraph", "filegraph", "d3dag", "summary", "detailed_summary", "list_changes",
    "list_input_changes", "list_params_changes", "list_code_changes", "list_untracked",
    "unlock", "cleanup_metadata", "containerize", "generate_unit_tests", "archive",
    "delete_all_output", "delete_temp_output", "report",
)


#: Snakemake's functions whose local ``args`` holds the parsed command line: ``args_to_api``
#: while it parses the workflow, ``parse_args`` while it renders a profile (a profile's YTE
#: ``__definitions__`` run there, with the options of the command line parsed once already).
_HOLDERS = ("args_to_api", "parse_args")


def planning_only(frame: FrameType | None = None) -> bool:
    """True when the ``snakemake`` command line that runs this code only plans (dry run,
    lint, listings, graphs, report, unlock); False for a real run, a remote job, and any
    use outside the command line."""
    frame = frame or sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name in _HOLDERS and "snakemake" in code.co_filename:
            args = frame.f_locals.get("args")
            if args is not None and hasattr(args, "dryrun"):
                if getattr(args, "report_after_run", False):  # --report ... --report-after-run runs
                    return bool(getattr(args, "dryrun", False))
                return any(bool(getattr(args, name, None)) for name in PLANNING_OPTIONS)
        frame = frame.f_back
    return False
