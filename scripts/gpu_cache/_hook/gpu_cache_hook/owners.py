"""gpu-cache's startup hook, who may have written a file or folder: the parts of the trust rule
(docs/guarantees.md) that judge one file or folder by its owner, mode and POSIX ACL, and
whether a folder above a cache lets another user swap it (ssh's StrictModes rule, #21).

Its one home: the host side (``gpu_cache.core.owners``, ``gpu_cache.jobenv.trust``) imports
this module, which imports nothing but the standard library. The messages are the callers': the
hook's are short, the host's say how to fix what they refuse. Python 3.9+.
"""

import errno
import os
import stat
import struct

#: The extended attributes of a POSIX ACL (Linux's binary format, see acl/include/acl_ea.h).
ACL_ACCESS = "system.posix_acl_access"
ACL_DEFAULT = "system.posix_acl_default"
ACL_USER_OBJ, ACL_USER, ACL_GROUP_OBJ, ACL_GROUP, ACL_MASK, ACL_OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
ACL_WRITE = 0x02
#: errno values of getxattr that mean "no ACL here" (none set, or a filesystem without ACLs).
NO_ACL = (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS)
_ACL_VERSION = 2
_ACL_HEADER = struct.Struct("<I")
_ACL_ENTRY = struct.Struct("<HHI")


def team_gid(info):
    """The group of a team's folder (``info``: its stat), or None: gpu-cache makes the folders of
    a shared-group cache group-writable and never world-writable (mode 2770)."""
    mode = info.st_mode
    return info.st_gid if mode & stat.S_IWGRP and not mode & stat.S_IWOTH else None


def owner_problem(info, team, *, where):
    """Why the file or folder ``info`` (its stat) may hold what another user put there, or None:
    it must be this user's or root's (or, in the team's folder ``team``, of the team's group),
    and nobody else may write it, by its mode or its ACL (``where``: its path or an open
    descriptor, :func:`acl_problem`). (A group-writable one of the owner's user-private group is
    refused here too: looking that group up may read the whole user database, too slow for each
    file a job serves; the host's rule for a file it reads once allows it.)"""
    in_team = team is not None and info.st_gid == team
    if info.st_uid not in (os.geteuid(), 0) and not in_team:
        return f"owned by uid {info.st_uid}"
    if info.st_mode & stat.S_IWOTH:
        return "writable by everyone"
    if info.st_mode & stat.S_IWGRP and not in_team:
        return f"writable by group {info.st_gid}"
    return acl_problem(where, info, team)


def acl_problem(where, info, team=None):
    """Why the POSIX ACL of the file or folder ``where`` (a path, whose link is followed as
    ``os.stat`` follows it, or an open descriptor; ``info``: its stat) lets someone write whom
    the owner rule accepts by its mode, or None: a named user other than the owner and root, a
    named group other than ``team`` and the owner's user-private group. With an ACL the mode's
    group bits are its mask, and no named entry writes beyond the mask: so it is read only where
    the mode lets a group write (a team's file, a user-private group's), and costs nothing
    elsewhere. One that cannot be read is refused."""
    if not info.st_mode & stat.S_IWGRP:
        return None
    try:
        entries = acl_entries(os.getxattr(where, ACL_ACCESS))  # (its callers judged what is there)
    except OSError as exc:
        if exc.errno in NO_ACL:
            return None
        return f"guarded by an ACL that cannot be read ({exc.strerror})"
    except ValueError as exc:
        return f"guarded by an ACL that cannot be judged ({exc})"
    found = [(tag, who) for tag, who in acl_writers(entries, info.st_uid, info.st_gid, team)
             if tag in (ACL_USER, ACL_GROUP)]  # (others and the owning group: the mode said)
    if not found:
        return None
    tag, who = found[0]
    return f"writable by {'user' if tag == ACL_USER else 'group'} {who} through an ACL"


def private_group(uid, gid):
    """Whether ``gid`` is the user-private group of ``uid``: named like the user, the user's
    primary group, with no other member listed and no other user's primary group. Group 0 never
    is (container platforms run arbitrary user ids in group 0 that no group entry lists)."""
    if gid == 0:
        return False
    import grp
    import pwd

    try:
        user, group = pwd.getpwuid(uid), grp.getgrgid(gid)
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


def acl_entries(data):
    """The ``(tag, perm, id)`` entries of an ACL in Linux's extended-attribute format
    (little-endian: a u32 version 2, then 8-byte entries of u16 tag, u16 perm, u32 id). Raises
    ValueError: not that format."""
    if len(data) < _ACL_HEADER.size or (len(data) - _ACL_HEADER.size) % _ACL_ENTRY.size \
            or _ACL_HEADER.unpack_from(data)[0] != _ACL_VERSION:
        raise ValueError(f"an ACL in a format gpu-cache does not know ({len(data)} bytes)")
    offsets = range(_ACL_HEADER.size, len(data), _ACL_ENTRY.size)
    return [_ACL_ENTRY.unpack_from(data, offset) for offset in offsets]


def read_acl(path, name=ACL_ACCESS):
    """The entries of the ACL ``name`` of ``path``; [] where it has none (or the filesystem has
    no ACLs). Raises OSError (it cannot be read), ValueError (not a format this knows)."""
    try:
        data = os.getxattr(path, name)
    except OSError as exc:
        if exc.errno in NO_ACL:
            return []
        raise
    return acl_entries(data)


def _mask(entries):
    return next((perm for tag, perm, _who in entries if tag == ACL_MASK), 0o7)


def group_obj_writes(entries):
    """Whether the owning group may write through the ACL ``entries`` (with an ACL, the mode's
    group bits are its mask)."""
    return any(tag == ACL_GROUP_OBJ and perm & _mask(entries) & ACL_WRITE for tag, perm, _who in entries)


def acl_writers(entries, owner, gid, team=None):
    """``(tag, id)`` of each entry of ``entries`` that lets someone besides the owner and root
    write and must not: a named user, a group other than ``team`` or the owner's user-private
    group, the owning group ``gid`` (its id), others (id None). Named entries and the owning
    group are limited by the mask entry (when there is one)."""
    mask, writers = _mask(entries), []
    for tag, perm, who in entries:
        if tag == ACL_OTHER:
            if perm & ACL_WRITE:
                writers.append((tag, None))
        elif perm & mask & ACL_WRITE:
            if tag == ACL_USER and who not in (owner, 0):
                writers.append((tag, who))
            elif tag in (ACL_GROUP, ACL_GROUP_OBJ):
                group = who if tag == ACL_GROUP else gid
                if group != team and not private_group(owner, group):
                    writers.append((tag, group))
    return writers


def may_swap(mode, owner, gid, below_owner, me, team=None, private=False):
    """Who besides this user (``me``) and root can rename the entry below a folder above a
    cache, and so put theirs in its place: "owner", "group", "others", or None (#21):

    - the folder is owned by ``me`` or root, or its group is ``team`` (a shared-group cache:
      another member's folder); else "owner";
    - with the sticky bit only an entry's owner, the folder's owner and root may rename it: a
      sticky folder anyone may write (``/tmp``) is safe when the entry below is ``me``'s or root's;
    - else world-writable is "others", and group-writable is "group" unless the group is
      ``team`` or the owner's user-private group (``private``; the caller looks it up, where the
      answer would be "group": it may read the whole user database).

    Pure: the caller stats the folder and the entry below it (``lstat``)."""
    shared = team is not None and gid == team
    if owner not in (me, 0) and not shared:
        return "owner"
    if mode & stat.S_ISVTX and below_owner in (me, 0):
        return None
    if mode & stat.S_IWOTH:
        return "others"
    if mode & stat.S_IWGRP and not (shared or private):
        return "group"
    return None


def ancestors(top):
    """``(folder, entry)`` for every folder above ``top``, from ``/`` down, with its entry on the
    way down: along the path as written (the folders that hold any link on it) and along the path
    the links lead to."""
    pairs = {}
    for start in (os.path.abspath(top), os.path.realpath(top)):
        entry, folder = start, os.path.dirname(start)
        while entry != folder:
            pairs[folder, entry] = None
            entry, folder = folder, os.path.dirname(folder)
    return sorted(pairs, key=lambda pair: len(pair[1]))
