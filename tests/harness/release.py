"""gpu-cache as its users install it: the sdist and wheel built from this checkout, fresh virtual
environments that hold the wheel (or no gpu-cache at all), and git repositories with a tag that a
workflow serves as a module by tag (``gitfile(<clone>, path=..., tag=...)``, Snakemake's
``github(...)`` offline).

A fresh venv gets gpu-cache's dependencies (Snakemake, jax, ...) from the test's own venv through
a ``.pth`` line, not from an index: site adds that folder to the path without reading the ``.pth``
files in it, so the test venv's own gpu-cache (an editable install) stays out, and the wheel's is
the only one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from helpers import REPO

#: This checkout's release (workflow/VERSION, the one source).
VERSION = (REPO / "workflow" / "VERSION").read_text().strip()
#: The tag a release of this checkout carries.
TAG = f"v{VERSION}"
#: Git as the tests run it: no user config, a fixed author.
GIT_ENV = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "test", "GIT_AUTHOR_EMAIL": "test@example.org",
           "GIT_COMMITTER_NAME": "test", "GIT_COMMITTER_EMAIL": "test@example.org"}


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, check=True, capture_output=True,
                          text=True).stdout


def build(outdir: Path) -> tuple[Path, Path]:
    """``python -m build`` of this checkout (sdist, then the wheel from the sdist, as a release
    is made), offline: the sdist and the wheel."""
    command = [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(outdir), str(REPO)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (sdist,) = outdir.glob("*.tar.gz")
    (wheel,) = outdir.glob("*.whl")
    return sdist, wheel


def fresh_venv(folder: Path, *paths: Path) -> Path:
    """A new venv (no pip) whose Python finds the test venv's packages and ``paths`` after its
    own, and no gpu-cache: its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    asked = [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
    site = Path(subprocess.run(asked, check=True, capture_output=True, text=True).stdout.strip())
    # "zz": after the wheel's gpu-cache.pth, whose folder then comes first on the path.
    lines = [*map(str, paths), sysconfig.get_paths()["purelib"]]
    (site / "zz-test-dependencies.pth").write_text("".join(f"{line}\n" for line in lines))
    return python


def install(python: Path, wheel: Path) -> None:
    """pip install of ``wheel`` (non-editable, its dependencies the test venv's) into ``python``'s venv."""
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                           "--no-deps", "--no-index", str(wheel)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def tagged_repo(files: Path, folder: Path, tag: str) -> Path:
    """A git repository of the files in ``files`` (a folder) committed and tagged ``tag``, as a
    clone without a working tree (nothing lies on disk beside a file it serves): its path."""
    source = folder.with_name(folder.name + "-source")
    shutil.copytree(files, source, symlinks=True)
    git("init", "--quiet", cwd=source)
    git("add", "--all", cwd=source)
    git("commit", "--quiet", "--message", tag, cwd=source)
    git("tag", tag, cwd=source)
    git("clone", "--quiet", "--no-checkout", str(source), str(folder), cwd=source.parent)
    shutil.rmtree(source)
    return folder


def checkout_files(folder: Path) -> Path:
    """This checkout's files as git has them here (tracked, and new ones not ignored), copied
    into ``folder`` (links as links): what a release of the working tree holds."""
    listed = git("ls-files", "--cached", "--others", "--exclude-standard", "-z", cwd=REPO).split("\0")
    for name in filter(None, listed):
        path = REPO / name
        if not (path.exists() or path.is_symlink()):
            continue  # deleted in the working tree
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            (folder / name).symlink_to(os.readlink(path))
        else:
            shutil.copy2(path, folder / name)
    return folder


def released_repo(tmp_path: Path) -> Path:
    """gpu-cache of this checkout in a git repository, tagged :data:`TAG`."""
    return tagged_repo(checkout_files(tmp_path / "gpu-cache-files"), tmp_path / "gpu-cache.git", TAG)
