"""Who may write a cache: whoever can add a file to a cache folder can run code in every job
that reads it (JAX and Triton load what they find under the key they compute; nothing is
signed). So a cache folder (the cache root, each kind's folder, and every folder from the
root down to it) is trusted only when nobody but its owner, root, and, in shared-group mode,
the members of ``shared_group`` can add files to it:

- **owner**: the current user or root (root can change your jobs anyway). A folder owned by
  another user is trusted only in shared-group mode, when its group is ``shared_group``.
  gpu-cache creates the folders of a shared cache group-writable with the setgid bit
  (:data:`SHARED_MODE`), so that everything below keeps the group.
- **others**: a world-writable folder is refused, with or without the sticky bit. The sticky
  bit (as on ``/tmp``) stops others from deleting or renaming your files, not from adding
  theirs, and an entry planted under your key before you compile it is served to you.
- **group**: a group-writable folder is refused unless its group is ``shared_group``, or the
  owner's user-private group: a group named like the owner, which is the owner's primary
  group, lists no other member in the group database and is no other user's primary group
  (the usual layout with ``umask 002``, where every folder a user makes is group-writable by a
  group of one). Group 0 never counts as a private group: container platforms such as
  OpenShift run arbitrary user ids in group 0 that no group or password entry lists, so a
  folder writable by group 0 is refused unless ``shared_group`` names that group.
- **ACL**: a POSIX ACL (``system.posix_acl_access``) that grants write to a named user other
  than the owner and root, to a named group, or to the owning group (each through the ACL's
  mask) is judged as above: a named user is refused, a group is accepted only when it is
  ``shared_group`` or the owner's private group. A default ACL
  (``system.posix_acl_default``) is judged the same way, since it decides who can write the
  folders that JAX and Triton create inside.

- **above the root**: whoever may rename the root in a folder above it may put a cache of
  theirs in its place after ``env`` checked it, so every folder above the root (along the path
  as written and along where its links lead) must be owned by you or root (or be in the
  ``shared_group``) and writable by nobody else, unless its sticky bit protects the entry of
  yours below it, as ssh's StrictModes judges a home (#21).

The rules that judge one folder by its owner, mode and ACL, and the folders above it, are the
startup hook's (``_hook/gpu_cache_hook/owners.py``, which this imports): the hook judges each
node's node-local folders by them. What is here says, for each refusal, how to fix it.

Every refusal is one sentence that says what is wrong and how to fix it (``chmod o-w,g-w``,
``setfacl -b``, or ``shared_group: GROUP``). :func:`distrust` never raises for filesystem
trouble; :func:`make_folder` raises OSError, which :func:`gpu_cache.jobenv.fs.check_folder` reports.
"""

from __future__ import annotations

import grp
import os
import pwd
import shlex
import stat
from pathlib import Path

from gpu_cache._hook.gpu_cache_hook import owners
from gpu_cache._hook.gpu_cache_hook.owners import ACL_ACCESS, ACL_DEFAULT
from gpu_cache.core.owners import Team, private_group

#: Mode of a folder gpu-cache creates for a shared group: group-writable, setgid, no others.
SHARED_MODE = 0o2770


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


def _acl_writers(entries: list[tuple[int, int, int]], owner: int, gid: int,
                 shared_gid: int | None) -> list[str]:
    """Who besides the owner and root gets write through the ACL ``entries`` and must not: e.g.
    ``["user nobody", "group staff"]`` (the rule: ``owners.acl_writers``)."""
    names = {owners.ACL_USER: lambda who: f"user {_user_name(who)}",
             owners.ACL_GROUP: lambda who: f"group {group_name(who)}",
             owners.ACL_GROUP_OBJ: lambda who: f"group {group_name(who)} (its owning group)",
             owners.ACL_OTHER: lambda _who: "everyone (other)"}
    return [names[tag](who) for tag, who in owners.acl_writers(entries, owner, gid, shared_gid)]


def make_folder(path: Path, team: Team | None, private: bool = False) -> None:
    """Create ``path`` and its missing parents; in shared-group mode give each folder that
    this call creates, or that the user owns, the group and :data:`SHARED_MODE`. Otherwise
    the folders it creates are never group- or world-writable, whatever the umask (with
    ``umask 002`` and a primary group that is not private, they would be refused);
    ``private``: nor readable by others (mode 0700: the node-local tier, issue 23).

    Raises:
        OSError: a folder cannot be created, or its group cannot be set.
    """
    missing = []
    current = path
    while current != current.parent:
        try:
            os.lstat(current)
            break
        except FileNotFoundError:
            missing.append(current)
            current = current.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700 if private else 0o755)  # the umask may take more away, never add
        except FileExistsError:
            pass  # made meanwhile by another process: judged like any existing folder
    if not missing:
        path.mkdir(exist_ok=True)  # exists: raises only when it is not a folder
    if team is None:
        return
    gid = team.gid
    for folder in [*missing, path]:
        info = folder.stat()
        if info.st_uid != os.geteuid():
            continue  # another member's folder: distrust() checks its group
        if info.st_gid != gid:
            os.chown(folder, -1, gid)
        if stat.S_IMODE(info.st_mode) & SHARED_MODE != SHARED_MODE:
            os.chmod(folder, stat.S_IMODE(info.st_mode) | SHARED_MODE)


def _share_hint(team: Team | None) -> str:
    if team is not None:
        return ""
    return ", or, for a team cache, set `shared_group: GROUP` in the config"


def _distrust_one(folder: Path, team: Team | None) -> str | None:
    info = folder.stat()
    me = os.geteuid()
    quoted = shlex.quote(str(folder))  # in the commands a user copies
    shared_gid = team.gid if team is not None else None
    mode = stat.S_IMODE(info.st_mode)
    owner = _user_name(info.st_uid)
    if info.st_uid not in (me, 0) and (shared_gid is None or info.st_gid != shared_gid):
        if shared_gid is None:
            return (f"{folder} is owned by {owner}, not by you ({_user_name(me)}), and whoever "
                    f"owns a cache can run code in your jobs, so it is refused; fix: "
                    f"`chown -R {_user_name(me)} {quoted}`, use a cache root of your own, or, "
                    f"for a team cache, `chgrp -R GROUP {quoted} && chmod -R g+ws {quoted}` and "
                    "set `shared_group: GROUP` in the config")
        return (f"{folder} is owned by {owner} and its group is {group_name(info.st_gid)}, not "
                f"the shared_group {team.name}, so it is refused; fix: `chgrp -R "
                f"{shlex.quote(team.name)} {quoted} && chmod -R g+ws {quoted}`")
    acls = {name: owners.read_acl(folder, name) for name in (ACL_ACCESS, ACL_DEFAULT)}
    group_writes = bool(mode & stat.S_IWGRP)
    if acls[ACL_ACCESS]:  # with an ACL the mode's group bits are its mask: ask the entries
        group_writes = owners.group_obj_writes(acls[ACL_ACCESS])
    world = bool(mode & stat.S_IWOTH)
    bad_group = group_writes and info.st_gid != shared_gid and not private_group(info.st_uid, info.st_gid)
    if world or bad_group:
        what = "world-writable" if world else f"writable by group {group_name(info.st_gid)}"
        if world and mode & stat.S_ISVTX:
            what += " (the sticky bit stops others deleting your entries, not planting theirs)"
        if world and bad_group:
            what += f" and writable by group {group_name(info.st_gid)}"
        bits = ",".join(bit for bit, on in (("o-w", world), ("g-w", bad_group)) if on)
        return (f"{folder} is {what}, so others could plant compiled code that your jobs "
                f"would run, and it is refused; fix: `chmod {bits} {quoted}`"
                f"{_share_hint(team) if bad_group else ''}")
    for name, entries in acls.items():
        writers = _acl_writers(entries, info.st_uid, info.st_gid, shared_gid)
        if writers:
            which = "an ACL" if name == ACL_ACCESS else "a default ACL (inherited by new folders)"
            flag = "-b" if name == ACL_ACCESS else "-k"
            return (f"{folder} has {which} that lets {', '.join(writers)} write, so others could "
                    f"plant compiled code that your jobs would run, and it is refused; fix: "
                    f"`setfacl {flag} {quoted}`"
                    f"{_share_hint(team) if any(w.startswith('group') for w in writers) else ''}")
    return None


def _distrust_above(top: Path, team: Team | None, missing_ok: bool = False) -> str | None:
    """Why a folder above ``top`` lets another user swap it (``owners.may_swap``), or None.
    ``missing_ok``: a folder on the way that does not exist is one this user would make.

    Raises:
        OSError, ValueError: a folder cannot be inspected.
    """
    me = os.geteuid()
    shared_gid = team.gid if team is not None else None
    for folder, entry in owners.ancestors(top):
        if missing_ok and not os.path.lexists(folder):
            continue
        info = os.stat(folder)
        below = os.lstat(entry).st_uid if not missing_ok or os.path.lexists(entry) else me
        private = bool(info.st_mode & 0o022) and private_group(info.st_uid, info.st_gid)
        who = owners.may_swap(info.st_mode, info.st_uid, info.st_gid, below, me, shared_gid, private)
        if who is None:
            continue
        quoted = shlex.quote(folder)
        if info.st_mode & stat.S_ISVTX and who != "owner":  # the cause is the entry's owner
            return (f"{entry} is owned by {_user_name(below)}, not by you: another user made it in "
                    f"{folder} (which everyone may write to; its sticky bit protects only entries of "
                    f"yours), so they decide what is in it; it is refused; fix: have it removed, or "
                    f"choose a cache root under folders owned by you or root")
        what = {"owner": f"owned by {_user_name(info.st_uid)}", "others": "writable by everyone",
                "group": f"writable by group {group_name(info.st_gid)}"}[who]
        fix = "choose a cache root under folders owned by you or root"
        if who != "owner" and below in (me, 0):
            bit = "o-w" if who == "others" else "g-w"
            fix = (f"`chmod +t {quoted}` (then only an entry's owner can rename it) or `chmod {bit} "
                   f"{quoted}`{_share_hint(team) if who == 'group' else ''}, or {fix}")
        return (f"{folder}, above the cache root, is {what}, so another user could rename {entry} "
                f"away and put a cache of theirs in its place, which your jobs would run; it is "
                f"refused; fix: {fix}")
    return None


def distrust(path: Path, team: Team | None, trusted_above: Path | None = None,
             missing_ok: bool = False) -> str | None:
    """Why ``path`` (and every folder from ``trusted_above`` down to it) must not be used as a
    cache, or None when it may. With ``trusted_above`` (the cache root), the folders above it
    must not let another user swap it either (``owners.may_swap``). ``missing_ok``: the folders
    that do not exist yet are judged as this user would make them (a diagnosis that creates
    nothing); those that exist as they are. Never raises for filesystem trouble."""
    if trusted_above is not None:
        try:
            why = _distrust_above(trusted_above, team, missing_ok)
        except OSError as exc:
            return f"cannot inspect the folders above {trusted_above} (so it is not trusted): " \
                   f"{exc.strerror or exc}"
        except ValueError as exc:  # a NUL in the path
            return f"cannot inspect the folders above {trusted_above} (so it is not trusted): {exc}"
        if why:
            return why
    folders = [path]
    if trusted_above is not None and path.is_relative_to(trusted_above):
        current = path.parent
        while current.is_relative_to(trusted_above):
            folders.append(current)
            if current == trusted_above:
                break
            current = current.parent
    for folder in reversed(folders):
        if missing_ok and not os.path.lexists(folder):
            continue
        try:
            why = _distrust_one(folder, team)
        except OSError as exc:
            return f"cannot inspect {folder} (so it is not trusted): {exc.strerror or exc}"
        except ValueError as exc:  # an ACL in an unknown format, a NUL in the path
            return f"cannot inspect {folder} (so it is not trusted): {exc}"
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
