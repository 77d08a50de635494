"""gpu-cache: warm, validate, prune and observe the JIT compile caches of GPU jobs.

The public entry points are the CLI (``gpu-cache`` / ``python -m gpu_cache``) and the
modules it is built from: :mod:`gpu_cache.core.kinds` (the cache kinds), :mod:`gpu_cache.config.settings`
(config and cache root), :mod:`gpu_cache.jobenv.env` (the exported environment),
:mod:`gpu_cache.commands.warm`, :mod:`gpu_cache.commands.validate`, :mod:`gpu_cache.commands.prune`,
:mod:`gpu_cache.commands.stats` and the report types of :mod:`gpu_cache.core.reports`.

Progress and warnings go through :mod:`logging` (logger ``gpu_cache``), which prints them
on stderr as ``gpu-cache: ...`` and ``gpu-cache: warning: ...`` lines, one line each: what
a message holds of the user's config or of the filesystem is escaped there (``core.shown``).
"""

import logging
import sys
from pathlib import Path

#: The workflow this package carries (a link to the checkout's workflow/, files in a wheel).
WORKFLOW = Path(__file__).with_name("workflow")
#: The embedded default config (a link to the checkout's config/config.yaml, a file in a wheel).
DEFAULT_CONFIG_FILE = Path(__file__).with_name("config") / "config.yaml"


def _version() -> str:
    """The release, from its one source, workflow/VERSION (which the build and the workflow read
    too). "unknown" inside a job's image given a checkout's scripts/ alone, where the link to
    workflow/ leads nowhere; nothing there asks for it."""
    try:
        return (WORKFLOW / "VERSION").read_text().strip()
    except OSError:
        return "unknown"


__version__ = _version()


def snakefile() -> str:
    """The path of this package's workflow/Snakefile: for a host's ``module`` (``snakefile:
    gpu_cache.snakefile()``) and the folder ``gpu-cache deploy`` writes (``include:``)."""
    return str(WORKFLOW / "Snakefile")


class _StderrHandler(logging.Handler):
    """Writes to whatever ``sys.stderr`` is at the time (a test may replace it)."""

    def emit(self, record: logging.LogRecord) -> None:
        prefix = "gpu-cache: warning: " if record.levelno >= logging.WARNING else "gpu-cache: "
        try:
            from gpu_cache.core.shown import shown

            sys.stderr.write(f"{shown(prefix + record.getMessage())}\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - a closed stderr must not break the caller
            self.handleError(record)


_logger = logging.getLogger(__name__)
if not _logger.handlers:
    _logger.addHandler(_StderrHandler())
    _logger.setLevel(logging.INFO)
    _logger.propagate = False  # Snakemake's own handlers would print it a second time
