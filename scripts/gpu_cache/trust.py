"""Who may write a cache: whoever can write it can run code in every job that reads it.

A cache folder is trusted when it is not world-writable and is owned by the current user
or root. A folder owned by another user is trusted only in shared-group mode (config
``shared_group``), when its group is that group. gpu-cache creates folders of a shared
cache group-writable with the setgid bit, so that everything below keeps the group.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path

from gpu_cache.errors import UsageError

#: Mode of a folder gpu-cache creates for a shared group: group-writable, setgid, no others.
SHARED_MODE = 0o2770


def group_id(name: str) -> int:
    """The id of group ``name`` (a name or a number).

    Raises:
        UsageError: no such group on this machine.
    """
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        if name.isdigit():
            return int(name)
        raise UsageError(f"config key shared_group: no group {name!r} on this machine "
                         "(see `getent group`)") from None


def group_name(gid: int) -> str:
    """The name of group ``gid``, or the number as text."""
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def make_folder(path: Path, shared_group: str | None) -> None:
    """Create ``path`` and its missing parents; in shared-group mode give each folder that
    this call creates, or that the user owns, the group and :data:`SHARED_MODE`.

    Raises:
        OSError: a folder cannot be created, or its group cannot be set.
    """
    missing = []
    current = path
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    path.mkdir(parents=True, exist_ok=True)
    if shared_group is None:
        return
    gid = group_id(shared_group)
    for folder in [*missing, path]:
        info = folder.stat()
        if info.st_uid != os.geteuid():
            continue  # another member's folder: distrust() checks its group
        if info.st_gid != gid:
            os.chown(folder, -1, gid)
        if stat.S_IMODE(info.st_mode) & SHARED_MODE != SHARED_MODE:
            os.chmod(folder, stat.S_IMODE(info.st_mode) | SHARED_MODE)


def _distrust_one(folder: Path, shared_group: str | None) -> str | None:
    info = folder.stat()
    me = os.geteuid()
    fix_group = (f"or share it with a team: `chgrp -R GROUP {folder} && chmod -R g+ws {folder}` and set "
                 "`shared_group: GROUP` in the config")
    if info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
        return (f"{folder} is world-writable, so anyone could plant code that your jobs run; "
                f"refusing it. Fix: `chmod o-w {folder}`, {fix_group}")
    if info.st_uid in (me, 0):
        return None  # yours, or root's (root can change your jobs anyway)
    owner = _user_name(info.st_uid)
    if shared_group is None:
        return (f"{folder} is owned by {owner}, not by you ({_user_name(me)}); whoever owns a cache "
                f"can run code in your jobs, so it is refused. Fix: `chown -R {_user_name(me)} "
                f"{folder}`, {fix_group}")
    gid = group_id(shared_group)
    if info.st_gid != gid:
        return (f"{folder} is owned by {owner} and its group is {group_name(info.st_gid)}, not the "
                f"shared_group {shared_group}; refusing it. Fix: `chgrp -R {shared_group} {folder} "
                f"&& chmod -R g+ws {folder}`")
    return None


def distrust(path: Path, shared_group: str | None, trusted_above: Path | None = None) -> str | None:
    """Why ``path`` (and every folder from ``trusted_above`` down to it) must not be used as a
    cache, or None when it may. Never raises for filesystem trouble."""
    folders = [path]
    if trusted_above is not None and path.is_relative_to(trusted_above):
        current = path.parent
        while current.is_relative_to(trusted_above):
            folders.append(current)
            if current == trusted_above:
                break
            current = current.parent
    for folder in reversed(folders):
        try:
            why = _distrust_one(folder, shared_group)
        except OSError as exc:
            return f"cannot inspect {folder}: {exc.strerror or exc}"
        if why:
            return why
    return None


def share_with_group() -> None:
    """Let the group write what this process and its children create (clear the umask's
    group bits). The caches create files with the default mode, so with the usual umask 022
    a team member could read but not extend another member's Triton key folders, nor
    refresh JAX's ``-atime`` files. A umask cannot be exported as an environment
    variable; this changes it for this process, which the jobs it starts inherit."""
    current = os.umask(0)
    os.umask(current & ~0o070)
