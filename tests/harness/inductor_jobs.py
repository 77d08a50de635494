"""torch.compile jobs under gpu-cache env, for the Inductor tests (issue 31)."""

from __future__ import annotations

from pathlib import Path

from gpu_cache.config.settings import settings_from
from gpu_cache.jobenv import env
from helpers import clean_environ

#: The built-in workload, small: one transformer block, one sequence length (2 FX graphs).
WORKLOAD = ["--shape", "16", "--blocks", "1", "--d-model", "32", "--heads", "2"]


def job_env(root: Path) -> dict[str, str]:
    """A job's environment as gpu-cache exports it for ``root`` (the hook on PYTHONPATH)."""
    base = clean_environ()
    exports = env.resolve(settings_from({"single_flight": {"timeout": "3m"}}, cache_root=str(root)), base)
    return env.job_environ(exports, base)
