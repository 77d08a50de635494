"""gpu-cache's own state under a cache root (``<root>/state/``: the outputs proof's references,
the set-aside lists, the kept measurements and verdicts): made with safe modes whatever the
umask, and read only where an entry would be read.

Whoever may write a file gpu-cache acts on steers it as an entry's writer steers a job: a
reference rewritten by another account failed every validation and set correct entries aside
run after run. So a state file is read only when it and every folder from the root down to it
pass the trust rule of a cache entry (:func:`gpu_cache.core.owners.written_by_others`: yours or
root's, or the team's in a team's root; writable by nobody else), and the folders gpu-cache
makes here are hardened as entries are (:func:`gpu_cache.core.safe_io.new_folder`: under
``umask 000`` they would be 0777). Standard library only: the workload runner uses it in jobs.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpu_cache.core import names, owners, safe_io
from gpu_cache.core.owners import Untrusted

__all__ = ["Untrusted", "distrust", "folder", "make", "read", "team"]


def folder(root: Path) -> Path:
    """The state folder of the cache root ``root``."""
    return root / names.STATE_FOLDER


def team(root: Path) -> int | None:
    """The group of a team's root (gpu-cache makes a shared-group cache's folders group-writable,
    never world-writable: :func:`gpu_cache.core.owners.team_of`), or None: as the startup hook
    judges the shared root."""
    try:
        return owners.team_of(os.stat(root))
    except OSError:
        return None


def distrust(path: Path, root: Path) -> str | None:
    """Why a folder from the root's state folder down to ``path`` (itself included, where it is
    a folder) may hold what another account put there, or None. One that does not exist yet
    is no reason."""
    top = folder(root)
    below = path.relative_to(top).parts
    group = team(root)
    current = top
    for part in ("", *below):
        current = current / part if part else current
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return f"{current} cannot be read ({exc.strerror or exc})"
        if not stat.S_ISDIR(info.st_mode):
            return None if current == path else f"{current} is {safe_io.describe(info.st_mode)}, not a folder"
        why = owners.written_by_others(info, group, where=current)
        if why is not None:
            return f"{current} is {why}"
    return None


def make(root: Path, *parts: str) -> Path:
    """The folder ``<root>/state/<parts...>``, its missing folders made hardened (never writable
    by others, nor by a group but a team's, whatever the umask).

    Raises:
        Untrusted: a folder on the way may hold what another account put there: gpu-cache
            keeps nothing there (it would never read it back).
        OSError: a folder cannot be made.
    """
    for depth in range(len(parts) + 1):
        current = folder(root).joinpath(*parts[:depth])
        try:
            safe_io.new_folder(current)
        except FileExistsError:
            pass  # made before (or meanwhile): judged now
        why = distrust(current, root)  # before anything is made in it
        if why is not None:
            raise Untrusted(why)
    return folder(root).joinpath(*parts)


def read(path: Path, root: Path, limit: int) -> bytes:
    """The bytes of the state file ``path`` (at most ``limit``), where it and its folders pass
    the trust rule (:func:`distrust`, :func:`gpu_cache.core.owners.read_trusted`).

    Raises:
        Untrusted: another account may have written it or a folder above it.
        FileNotFoundError: there is none.
        OSError: it cannot be read, is not a regular file or is too large.
    """
    why = distrust(path.parent, root)
    if why is not None:
        raise Untrusted(why)
    return owners.read_trusted(path, limit, team(root))
