"""``gpu-cache deploy DIR``: a folder that runs the installed package's workflow, in the shape
``snakedeploy deploy-workflow`` gives a workflow (``workflow/Snakefile`` and
``config/config.yaml``), so that ``snakemake --profile gpu-cache`` runs the main job there."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpu_cache.core.errors import UsageError
from gpu_cache.core.shown import shown

#: The folder's Snakefile. It names neither a version nor a path: it includes the workflow of
#: the package Snakemake's Python imports, so that after an upgrade the next run is the new
#: release's workflow, and the workflow itself says when that package is missing.
SNAKEFILE = '''\
# gpu-cache's workflow, from the installed gpu-cache package (written by `gpu-cache deploy`):
# `snakemake --profile gpu-cache` in this folder runs it with config/config.yaml. It names no
# version and no path: after `pip install --upgrade` of gpu-cache, the next run is the new one's.

import gpu_cache


include: gpu_cache.snakefile()


# What a plain `snakemake` builds here: the workflow's own target (Snakemake does not make an
# included file's default target the includer's).
rule deployed:
    default_target: True
    input:
        rules.all.input,
'''


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", metavar="DIR", help="the folder to write (made where it does not exist)")
    parser.add_argument("--force", action="store_true",
                        help="replace a workflow/Snakefile or config/config.yaml that differs")
    parser.add_argument("--cache-root", help=argparse.SUPPRESS)  # every command takes it; no cache here


def run(args: argparse.Namespace) -> int:
    from gpu_cache import DEFAULT_CONFIG_FILE

    folder = Path(args.folder)
    files = {folder / "workflow" / "Snakefile": SNAKEFILE,
             folder / "config" / "config.yaml": DEFAULT_CONFIG_FILE.read_text()}
    differing = [path for path, text in files.items() if _differs(path, text)]
    if differing and not args.force:
        raise UsageError(f"{differing[0]} exists and differs from what deploy writes (edited?); "
                         "pass --force to replace it")
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    print(shown(f"deployed gpu-cache's workflow in {folder}; run it with: cd {folder} && "
                "snakemake --profile gpu-cache"))
    return 0


def _differs(path: Path, text: str) -> bool:
    """Whether ``path`` holds something other than ``text`` (a path that is not a regular file,
    e.g. a folder, differs)."""
    if not path.exists() and not path.is_symlink():
        return False
    try:
        return not path.is_file() or path.read_text() != text
    except (OSError, UnicodeDecodeError):
        return True
