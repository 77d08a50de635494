"""What the registry subcommands share with the CLI: their JSON reports and the GPU type."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from gpu_cache.config.settings import Settings


def emit(report: dict[str, Any], output: str | None, to_stdout: bool = True) -> None:
    """The JSON report into ``output`` (as every --output: never replacing what is not a
    regular file) and, ``to_stdout``, on stdout."""
    from gpu_cache.core.safe_io import write_output

    text = json.dumps(report, indent=2, default=str) + "\n"
    if output:
        write_output(Path(output), text, what="--output")
    if to_stdout:
        sys.stdout.write(text)


def gpu_type_of(settings: Settings, requested: str | None) -> str:
    """The GPU type asked for, else the first configured (this machine's when none is)."""
    from gpu_cache.config.targets import gpu_types

    return requested or next(iter(gpu_types(settings)))
