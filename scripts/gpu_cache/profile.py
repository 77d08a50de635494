"""The Snakemake profile: installing it, and the export it runs when Snakemake starts."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from gpu_cache.core import PACKAGE_PARENT
from gpu_cache.core.errors import UsageError

#: The shipped profiles: a link to the checkout's profiles/ folder, copied into a wheel.
SHIPPED = Path(__file__).with_name("profiles")
#: The line of the profile that install-profile fills with this package's location.
SCRIPTS_LINE = '  - gpu_cache_scripts = ""'


def export_from_profile() -> None:
    """Export the cache environment into this (Snakemake's) process, for every job it runs.

    Called by the profile's ``__definitions__``. The root comes from ``$GPU_CACHE_ROOT`` or
    the default; a problem warns and never stops Snakemake from starting. A command line that
    only plans (``-n``, ``--lint``, ...) exports nothing: probing the folders would create them.
    """
    from gpu_cache.config.settings import settings_from
    from gpu_cache.jobenv import env
    from gpu_cache.jobenv.planning import planning_only

    if planning_only():  # a dry run, --lint, a listing: no job runs, nothing may be created
        return
    try:
        env.export(settings_from({}))
    except Exception as exc:  # noqa: BLE001 - a raising profile stops snakemake obscurely
        print(f"gpu-cache: warning: cache environment not exported ({exc})", file=sys.stderr)


def default_profile_dir() -> Path:
    """Where Snakemake looks for ``--profile gpu-cache``: ``$XDG_CONFIG_HOME/snakemake/gpu-cache``."""
    config_home = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config_home) / "snakemake" / "gpu-cache"


def install_profile(name: str = "gpu-cache", target: Path | None = None, force: bool = False) -> Path:
    """Copy a shipped profile to ``target`` and point it at this package.

    Raises:
        UsageError: the profile is unknown, or the target exists (without ``force``).
    """
    known = sorted(p.name for p in SHIPPED.iterdir() if (p / "config.yaml").is_file()) \
        if SHIPPED.is_dir() else []
    if name not in known:
        raise UsageError(f"no shipped profile {name!r}; shipped profiles: {', '.join(known) or 'none'}")
    source = SHIPPED / name
    target = target or default_profile_dir().with_name(name)
    if target.exists() and not force:
        try:
            installed = (target / "config.yaml").read_text()
        except OSError:
            installed = None
        if installed == _filled(source):
            return target
        if installed is None or not _same_but_checkout(installed, source):
            raise UsageError(f"{target} exists and differs from the shipped profile (edited?); "
                             "pass --force to replace it")
        # The same profile installed from another checkout: point it at this one.
    target.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.is_file():
            shutil.copy2(item, target / item.name)
    (target / "config.yaml").write_text(_filled(source))
    return target


def _same_but_checkout(installed: str, source: Path) -> bool:
    """Whether ``installed`` is the shipped profile as install-profile wrote it from any
    checkout (only the package's folder differs)."""
    shipped = (source / "config.yaml").read_text()
    lines = installed.splitlines()
    placeholder = [i for i, line in enumerate(shipped.splitlines()) if line == SCRIPTS_LINE]
    if len(lines) != len(shipped.splitlines()) or not placeholder:
        return False
    lines[placeholder[0]] = SCRIPTS_LINE
    return lines == shipped.splitlines()


def _filled(source: Path) -> str:
    """The shipped profile with this package's folder filled in, as a quoted YAML scalar (a
    path may hold ``: `` or `` #``, which would end a plain one)."""
    text = (source / "config.yaml").read_text()
    statement = f"gpu_cache_scripts = {str(PACKAGE_PARENT)!r}"
    return text.replace(SCRIPTS_LINE, f"  - {json.dumps(statement)}", 1)
