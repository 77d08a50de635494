"""Who could have written a file: the part of the trust rule (gpu_cache.jobenv.trust) that judges
one file a job or a reader takes in, such as a record the startup hook left. Its rules are the
startup hook's (``_hook/gpu_cache_hook/owners.py``, standard library only), imported from there.
Standard library only: the Triton replay runs it inside job images.
"""

from __future__ import annotations

import errno
import functools
import grp
import os
import stat
from dataclasses import dataclass

from gpu_cache._hook.gpu_cache_hook import owners
from gpu_cache.core import safe_io
from gpu_cache.core.errors import UsageError


@dataclass(frozen=True)
class Team:
    """The ``shared_group`` of a team's cache: its name (what messages say) and id (what the
    rules compare), looked up once, when the settings are read (:func:`team_named`)."""

    name: str
    gid: int


def team_named(name: str) -> Team:
    """The team of the group ``name`` (a name or a number).

    Raises:
        UsageError: no such group on this machine.
    """
    try:
        return Team(name, grp.getgrnam(name).gr_gid)
    except KeyError:
        if name.isdigit():
            return Team(name, int(name))
        raise UsageError(f"config key shared_group: no group {name!r} on this machine "
                         "(see `getent group`)") from None


#: Whether ``gid`` is the user-private group of ``uid`` (the hook's rule, looked up once per pair
#: here: it may read the whole user database).
private_group = functools.lru_cache(maxsize=64)(owners.private_group)
#: The group of a team's folder (group-writable, never world-writable: how gpu-cache makes the
#: folders of a shared-group cache), or None.
team_of = owners.team_gid


def written_by_others(info: os.stat_result, team: int | None = None, *, where: str | os.PathLike[str] | int
                      ) -> str | None:
    """Why another user may have written the file ``info`` (its lstat), or None: it must be
    yours or root's (or, in a team's folder, of the ``team`` group), and nobody else may write
    it, by its mode or its POSIX ACL (``where``: its path or an open descriptor; a named user, or
    a group but the team and the owner's private group: ``owners.acl_problem``). Not the hook's
    ``owner_problem``: that one refuses a private group's file too (it judges every file a job
    serves, and the look-up may read the whole user database)."""
    in_team = team is not None and info.st_gid == team
    if info.st_uid not in (os.geteuid(), 0) and not in_team:
        return f"owned by uid {info.st_uid}"
    if info.st_mode & stat.S_IWOTH:
        return "writable by everyone"
    if info.st_mode & stat.S_IWGRP and not in_team and not private_group(info.st_uid, info.st_gid):
        return f"writable by group {info.st_gid}"
    return owners.acl_problem(where, info, team)


class Untrusted(OSError):
    """A file of gpu-cache's own (a record, a list, a reference) that another user may have
    written: never acted on. ``what``: which file or folder and why, as in "PATH is owned by
    uid 1001"."""

    def __init__(self, what: str) -> None:
        super().__init__(errno.EPERM, what)

    def __str__(self) -> str:
        return f"{self.strerror} (another user may have written it): not trusted"


def read_trusted(path: str | os.PathLike[str], limit: int, team: int | None = None) -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit``) where the trust rule lets
    gpu-cache act on it: :func:`written_by_others` of the file as opened (``team``: the group of
    a team's folder, :func:`team_of`), the rule an entry is read by.

    Raises:
        Untrusted: another user may have written it.
        OSError: as :func:`gpu_cache.core.safe_io.read_bounded` raises.
    """
    def judge(fd: int, info: os.stat_result) -> None:
        why = written_by_others(info, team, where=fd)
        if why is not None:
            raise Untrusted(f"{path} is {why}")

    return safe_io.read_bounded(path, limit, judge=judge)
