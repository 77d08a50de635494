"""gpu-cache: warm, validate, prune and observe the JIT compile caches of GPU jobs.

The public entry points are the CLI (``gpu-cache`` / ``python -m gpu_cache``) and the
modules it is built from: :mod:`gpu_cache.core.kinds` (the cache kinds), :mod:`gpu_cache.config.settings`
(config and cache root), :mod:`gpu_cache.jobenv.env` (the exported environment),
:mod:`gpu_cache.commands.warm`, :mod:`gpu_cache.commands.validate`, :mod:`gpu_cache.commands.prune`,
:mod:`gpu_cache.commands.stats` and the report types of :mod:`gpu_cache.core.reports`.

Progress and warnings go through :mod:`logging` (logger ``gpu_cache``), which prints them
on stderr as ``gpu-cache: ...`` and ``gpu-cache: warning: ...`` lines. The handler is
installed as soon as :mod:`logging` is loaded (by any module, at any time): a command that
logs nothing, such as ``gpu-cache env`` at every Snakemake start, never loads it (4 ms).
"""

import sys
from typing import Any

__version__ = "0.1.0"


def _install_handler(logging: Any) -> None:
    """Print the ``gpu_cache`` logger's records on stderr, prefixed (once per process)."""

    class _StderrHandler(logging.Handler):
        """Writes to whatever ``sys.stderr`` is at the time (a test may replace it)."""

        def emit(self, record: logging.LogRecord) -> None:
            prefix = "gpu-cache: warning: " if record.levelno >= logging.WARNING else "gpu-cache: "
            try:
                sys.stderr.write(f"{prefix}{record.getMessage()}\n")
                sys.stderr.flush()
            except Exception:  # noqa: BLE001 - a closed stderr must not break the caller
                self.handleError(record)

    logger = logging.getLogger(__name__)
    if not logger.handlers:
        logger.addHandler(_StderrHandler())
        logger.setLevel(logging.INFO)
        logger.propagate = False  # Snakemake's own handlers would print it a second time


class _WhenLoggingLoads:
    """A meta-path finder that installs the handler right after :mod:`logging` is imported,
    then leaves ``sys.meta_path``. It only wraps the loader Python's own path finder gives;
    should that fail, the import goes on as usual (without gpu-cache's handler)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "logging":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        try:
            finder = sys.modules["_frozen_importlib_external"].PathFinder
            spec = finder.find_spec(name, path)
            load = spec.loader.exec_module
        except Exception:  # noqa: BLE001 - never break an import
            return None

        def exec_module(module: Any) -> None:
            load(module)
            _install_handler(module)

        spec.loader.exec_module = exec_module
        return spec


if "logging" in sys.modules:
    _install_handler(sys.modules["logging"])
else:
    sys.meta_path.insert(0, _WhenLoggingLoads())
