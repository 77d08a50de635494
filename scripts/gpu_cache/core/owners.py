"""Who could have written a file: the part of the trust rule (gpu_cache.jobenv.trust) that judges
one file a job or a reader takes in, such as a record the startup hook left. Standard library
only: the Triton replay runs it inside job images.
"""

from __future__ import annotations

import functools
import grp
import os
import pwd
import stat


@functools.lru_cache(maxsize=64)
def private_group(uid: int, gid: int) -> bool:
    """Whether ``gid`` is the user-private group of ``uid``: named like the user, the user's
    primary group, with no other member listed and no other user's primary group. Group 0
    never is (container platforms run arbitrary user ids in group 0)."""
    if gid == 0:
        return False
    try:
        user = pwd.getpwuid(uid)
        group = grp.getgrgid(gid)
    except KeyError:
        return False
    if group.gr_name != user.pw_name or user.pw_gid != gid:
        return False
    if any(member != user.pw_name for member in group.gr_mem):
        return False
    try:
        return not any(entry.pw_gid == gid and entry.pw_uid != uid for entry in pwd.getpwall())
    except OSError:
        return False


def team_of(folder: os.stat_result) -> int | None:
    """The group of a team's folder (group-writable, never world-writable: how gpu-cache makes
    the folders of a shared-group cache), or None."""
    mode = folder.st_mode
    return folder.st_gid if mode & stat.S_IWGRP and not mode & stat.S_IWOTH else None


def written_by_others(info: os.stat_result, team: int | None = None) -> str | None:
    """Why another user may have written the file ``info`` (its lstat), or None: it must be
    yours or root's (or, in a team's folder, of the ``team`` group), and nobody else may write
    it (a group only where it is the team or the owner's private group)."""
    in_team = team is not None and info.st_gid == team
    if info.st_uid not in (os.geteuid(), 0) and not in_team:
        return f"owned by uid {info.st_uid}"
    if info.st_mode & stat.S_IWOTH:
        return "writable by everyone"
    if info.st_mode & stat.S_IWGRP and not in_team and not private_group(info.st_uid, info.st_gid):
        return f"writable by group {info.st_gid}"
    return None
