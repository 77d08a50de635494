"""What a round changed: its base commit, the package modules changed since it, and their lines."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

#: A hunk of ``git diff -U0``: where its lines start on the new side, and how many there are.
_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")


class Refused(Exception):
    """A wrong argument or state: said in one line, exit 2."""


def git(repo: Path, *args: str) -> str:
    result = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
    if result.returncode != 0:
        first = (result.stderr.strip().splitlines() or ["no output"])[0]
        raise Refused(f"git {' '.join(args)}: {first}")
    return result.stdout


def resolve_base(repo: Path, ref: str | None, hours: float) -> str:
    """The base commit: ``ref`` (a commit, tag or branch) when given, else the last commit on
    HEAD's first-parent line committed more than ``hours`` ago."""
    if ref is not None:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").strip()
    before = int(time.time() - hours * 3600)
    found = git(repo, "rev-list", "-1", "--first-parent", f"--before={before}", "HEAD").strip()
    if not found:
        raise Refused(f"no commit on HEAD is older than {hours:g} hours: give --base")
    return found


def changed_lines(repo: Path, base: str, package: str) -> dict[str, set[int]]:
    """The package's Python modules that differ from ``base`` in the working tree (committed or
    not, and untracked ones whole), each with its changed lines (numbered as the file is now)."""
    # A plain pathspec's * matches across folders: every module below the package.
    diff = git(repo, "diff", "-U0", "--no-color", "--no-ext-diff", base, "--", f"{package}/*.py")
    changed: dict[str, set[int]] = {}
    current = None
    for line in diff.splitlines():
        if line.startswith("+++ "):
            current = line[6:] if line.startswith("+++ b/") else None
        elif current and (hunk := _HUNK.match(line)):
            start, count = int(hunk.group(1)), int(hunk.group(2) or 1)
            changed.setdefault(current, set()).update(range(start, start + count))
    untracked = git(repo, "ls-files", "--others", "--exclude-standard", "--", package)
    for path in untracked.splitlines():
        if path.endswith(".py"):
            changed[path] = set(range(1, len((repo / path).read_text().splitlines()) + 1))
    return {path: lines for path, lines in sorted(changed.items()) if lines}


def every_line(repo: Path, package: str) -> dict[str, set[int]]:
    """Every line of every tracked module of the package."""
    tracked = git(repo, "ls-files", "--", f"{package}/*.py").splitlines()
    return {path: set(range(1, len((repo / path).read_text().splitlines()) + 1)) for path in tracked}
