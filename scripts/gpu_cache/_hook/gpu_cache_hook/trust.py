"""gpu-cache's startup hook, the node-local folders: loaded only when a folder a kind's tool
makes at start cannot be created (a cache root not bound into a container: the piece's
``makes``), or when a folder the job was given is node-local (``$TMPDIR/gpu-cache-<uid>/<kind>``,
exported by ``gpu-cache env`` for a read-only or unusable root, and made on each node by whoever
comes first: the piece's ``node-local``).

A tool that creates its cache folder at start raises where it cannot (Triton). The process
then uses ``$TMPDIR/gpu-cache-<uid>/<kind>``, the folder ``gpu-cache env`` falls back to. A node-local
folder is used only when it and ``gpu-cache-<uid>`` pass the trust rule ``gpu-cache env``
applies (``gpu_cache.jobenv.trust``, for a cache of one's own): owned by the user or root, and
nobody else can add a file to it (not others; not a group unless it is the owner's user-private
group; no POSIX ACL or default ACL that lets another user or group write), and no folder above
``gpu-cache-<uid>`` lets another user rename it away and put theirs in its place (the rule of
ssh's StrictModes: ``/tmp``'s sticky bit protects an entry of one's own). ``/tmp`` is shared
and bound into containers: whoever made that folder first would decide which kernels the job
loads (issue 21). Nothing is created inside a folder that fails. The process then compiles into
a private folder of its own (new, 0700, removed at exit): no cache across processes; or, for
single-flight's lock folder, runs without single-flight. Its record says why.
``tests/test_hook.py`` checks that this rule and gpu-cache's agree. Standard library only,
Python 3.9+.
"""

import errno
import os
import stat
import struct

from sitecustomize import NODE_LOCAL_PREFIX, RECORDS_VAR, TIER_VAR

ACL_ACCESS = "system.posix_acl_access"
ACL_DEFAULT = "system.posix_acl_default"
_USER, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x02, 0x04, 0x08, 0x10, 0x20
_WRITE = 0x02
_NO_ACL = (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS)


def private_group(uid, gid):
    """Whether ``gid`` is the user-private group of ``uid``: named like the user, the user's
    primary group, with no other member and no other user's primary group. Group 0 never is."""
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


def _acl(path, name):
    """The ``(tag, perm, id)`` entries of the ACL ``name`` of ``path``; [] without one."""
    try:
        data = os.getxattr(path, name)
    except OSError as exc:
        if exc.errno in _NO_ACL:
            return []
        raise
    if len(data) < 4 or (len(data) - 4) % 8 or struct.unpack_from("<I", data)[0] != 2:
        raise ValueError(f"an ACL in a format this hook does not know ({len(data)} bytes)")
    return [struct.unpack_from("<HHI", data, offset) for offset in range(4, len(data), 8)]


def _mask(entries):
    return next((perm for tag, perm, _who in entries if tag == _MASK), 0o7)


def _acl_writers(entries, owner, gid):
    """Who besides the owner and root may write through ``entries`` and must not."""
    mask, writers = _mask(entries), []
    for tag, perm, who in entries:
        if tag == _OTHER:
            if perm & _WRITE:
                writers.append("everyone (other)")
        elif perm & mask & _WRITE:
            if tag == _USER and who not in (owner, 0):
                writers.append(f"user {who}")
            elif tag == _GROUP and not private_group(owner, who):
                writers.append(f"group {who}")
            elif tag == _GROUP_OBJ and not private_group(owner, gid):
                writers.append(f"group {gid} (its owning group)")
    return writers


def _distrust_one(path):
    info = os.stat(path)
    if not stat.S_ISDIR(info.st_mode):
        return f"{path} is not a folder"
    if info.st_uid not in (os.geteuid(), 0):
        return f"{path} is owned by user {info.st_uid}, not by you"
    mode = stat.S_IMODE(info.st_mode)
    acls = ((ACL_ACCESS, _acl(path, ACL_ACCESS)), (ACL_DEFAULT, _acl(path, ACL_DEFAULT)))
    access = acls[0][1]
    group_writes = bool(mode & stat.S_IWGRP)
    if access:  # with an ACL the mode's group bits are its mask: ask the entries
        group_writes = any(tag == _GROUP_OBJ and perm & _mask(access) & _WRITE for tag, perm, _ in access)
    if mode & stat.S_IWOTH:
        return f"{path} is world-writable"
    if group_writes and not private_group(info.st_uid, info.st_gid):
        return f"{path} is writable by group {info.st_gid}"
    for name, entries in acls:
        writers = _acl_writers(entries, info.st_uid, info.st_gid)
        if writers:
            which = "an ACL" if name == ACL_ACCESS else "a default ACL"
            return f"{path} has {which} that lets {', '.join(writers)} write"
    return None


def may_swap(mode, owner, gid, below_owner, me, team=None):
    """Who besides this user and root can rename the entry below a folder above a cache, and so
    put theirs in its place: "owner", "group", "others", or None (gpu_cache.jobenv.trust's
    rule; ``team``: the group of a team's cache, its ``shared_group``). "group" is also the
    answer for the owner's user-private group, which the caller then lets pass."""
    shared = team is not None and gid == team
    if owner not in (me, 0) and not shared:
        return "owner"
    if mode & stat.S_ISVTX and below_owner in (me, 0):
        return None
    if mode & stat.S_IWOTH:
        return "others"
    if mode & stat.S_IWGRP and not shared:
        return "group"
    return None


def distrust_above(top, team=None):
    """Why a folder above ``top`` lets another user swap it, or None (``team``: see may_swap).
    Raises OSError or ValueError where a folder cannot be inspected."""
    pairs = {}
    for start in (os.path.abspath(top), os.path.realpath(top)):
        entry, folder = start, os.path.dirname(start)
        while entry != folder:
            pairs[folder, entry] = None
            entry, folder = folder, os.path.dirname(folder)
    me = os.geteuid()
    for folder, entry in sorted(pairs, key=lambda pair: len(pair[1])):
        info = os.stat(folder)
        below = os.lstat(entry).st_uid
        who = may_swap(info.st_mode, info.st_uid, info.st_gid, below, me, team)
        if who == "group" and private_group(info.st_uid, info.st_gid):
            who = None  # looked up only here: it may read the whole user database
        if who is not None and info.st_mode & stat.S_ISVTX and who != "owner":
            # the sticky bit guards an entry of one's own: this one another user made
            return f"{entry} is owned by user {below}, not by you: another user made it in {folder}"
        if who is not None:
            what = {"owner": f"owned by user {info.st_uid}", "others": "writable by everyone",
                    "group": f"writable by group {info.st_gid}"}[who]
            return f"{folder}, above {top}, is {what}, so another user could put a folder of theirs there"
    return None


def distrust(folder):
    """Why ``folder`` may not hold this user's cache, or None: it, and the folders above it,
    which must not let another user swap it. Never raises for filesystem trouble."""
    try:
        why = distrust_above(folder)
    except (OSError, ValueError) as exc:
        return f"cannot inspect the folders above {folder} (so it is not trusted): {exc}"
    if why:
        return why
    try:
        return _distrust_one(folder)
    except (OSError, ValueError) as exc:
        return f"cannot inspect {folder} (so it is not trusted): {exc}"


def _trusted_folders(folders, mode=0o755):
    """Make each of ``folders`` (outermost first) that is missing, checking each before going
    into it: why one is refused, or None."""
    for folder in folders:
        try:
            os.mkdir(folder, mode)  # the umask may take more away, never add
        except FileExistsError:
            pass
        except OSError as exc:
            return f"cannot create {folder}: {exc.strerror}"
        why = distrust(folder)
        if why:
            return why
    return None


def _remove_at_exit(folder):
    import atexit
    import shutil

    owner = os.getpid()

    def remove():
        if os.getpid() == owner:  # not in a forked child
            shutil.rmtree(folder, ignore_errors=True)

    atexit.register(remove)


_PRIVATE = []


def private_folder(name):
    """``<a private folder of this process>/<name>`` (new, 0700, removed at exit), made."""
    import tempfile

    if not _PRIVATE:
        _PRIVATE.append(tempfile.mkdtemp(prefix=f"{NODE_LOCAL_PREFIX}{os.getuid()}-private-"))
        _remove_at_exit(_PRIVATE[0])
    folder = os.path.join(_PRIVATE[0], name)
    os.makedirs(folder, 0o700, exist_ok=True)
    return folder


def _chain(folder):
    """``folder`` and the folders above it that are missing, outermost first."""
    missing = []
    while not os.path.lexists(folder):
        missing.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return list(reversed(missing)) or [folder]


def _tier_refused(tier, kinds):
    """Why the node-local tier ``tier`` may not be used on this node, or None: it, every folder
    above it and each of its ``kinds`` folders that exists pass the trust rule (made 0700 where
    missing, each checked before it is entered)."""
    why = _trusted_folders(_chain(tier), mode=0o700) or distrust(tier)
    if why:
        return why
    for kind in kinds:
        path = os.path.join(tier, kind)
        try:
            if stat.S_ISLNK(os.lstat(path).st_mode):
                return f"{path} is a symbolic link"
        except FileNotFoundError:
            continue
        except OSError as exc:
            return f"cannot inspect {path}: {exc.strerror}"
        try:
            why = _distrust_one(path)
        except (OSError, ValueError) as exc:
            why = f"cannot inspect {path} (so it is not trusted): {exc}"
        if why:
            return why
    return None


def guard(tier, kinds, folders, hook, stderr):
    """Before any tool reads them: the node-local tier ``tier`` (with its ``kinds`` folders) and
    the node-local folders the variables of ``folders`` (``(what, variable)``: the kind, or the
    hook's own part) point at (``$TMPDIR/gpu-cache-<uid>/<kind>``) may have been made on this
    node by another user, who would then decide what the job loads (and, through links and
    dates in them, what the tier's bound deletes). One that fails the trust rule is neither read
    nor written by any tool: every variable that points into it is pointed at a private folder
    of this process instead (records: none), with one warning line, and the record's
    ``fallbacks.<what>`` says why. Returns whether the tier may be used."""
    refused = []
    if tier:
        why = _tier_refused(tier, kinds)
        if why:
            for name, value in list(os.environ.items()):
                if name == TIER_VAR:
                    os.environ[name] = ""  # the tier is off, in this process and its children
                elif value == tier or value.startswith(tier + os.sep):
                    os.environ[name] = private_folder("tier") + value[len(tier):]
                    os.makedirs(os.environ[name], 0o700, exist_ok=True)
            refused.append(("tier", tier, why))
            _record(hook, "tier", wanted=tier[:500], problem=None, used=_PRIVATE[0], refused=why[:500])
    for what, name in folders:
        folder = (os.environ.get(name) or "").rstrip(os.sep)
        if not folder:
            continue
        why = _trusted_folders([os.path.dirname(folder), folder])
        if why:
            os.environ[name] = "" if name == RECORDS_VAR else private_folder(os.path.basename(folder))
            refused.append((name, folder, why))
            _record(hook, what, wanted=folder[:500], problem=None, used=os.environ[name] or None,
                    refused=why[:500])
    if refused:
        what, folder, why = refused[0]
        where = f"a private folder {_PRIVATE[0]}" if _PRIVATE else "no records"
        more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        label = "node-local tier" if what == "tier" else f"node-local folder of {what}"
        stderr(f"gpu-cache: warning: the {label} {folder[:300]} is refused ({why[:500]}){more}; this "
               f"process uses {where} instead, without a cache across processes\n")
    return not (tier and refused and refused[0][0] == "tier")


def _record(hook, what, **fields):
    hook.parts.setdefault("fallbacks", {})[what] = fields


def unmade(kind, name, wanted, why, hook, stderr):
    """The folder ``wanted`` of ``$name``, which the tool of ``kind`` makes at start and fails
    where it cannot (a cache root not bound into a container), cannot be created: ``$name`` is
    pointed at the node-local folder ``gpu-cache env`` falls back to,
    ``$TMPDIR/gpu-cache-<uid>/<kind>``, when it is trusted, else at a private one."""
    import tempfile

    base = os.path.join(tempfile.gettempdir(), f"{NODE_LOCAL_PREFIX}{os.getuid()}")
    local = os.path.join(base, kind)
    refused = _trusted_folders([base, local])
    if refused is None:
        used, what = local, f"this process uses {local}"
    else:
        used = private_folder(kind)
        what = (f"its node-local fallback is refused ({refused}), so this process uses a private "
                f"folder {used}, without a cache across processes")
    os.environ[name] = used
    _record(hook, kind, wanted=wanted[:500], problem=why, used=used, refused=refused)
    shown = wanted if len(wanted) <= 500 else wanted[:500] + "..."
    stderr(f"gpu-cache: warning: the {kind} cache folder {shown} ({name}) cannot be created ({why}); "
           f"{what}. Is the cache root bound into the container?\n")


def locks_node_local(folder, hook, stderr):
    """Single-flight's exported node-local lock folder: whether it may be used (another user
    who can add files to it could hold the locks that this job waits on)."""
    folder = folder.rstrip(os.sep)
    refused = _trusted_folders([os.path.dirname(folder), folder])
    if refused is None:
        return True
    _record(hook, "locks", wanted=folder[:500], problem=None, used=None, refused=refused)
    stderr(f"gpu-cache: warning: single-flight's node-local lock folder is refused ({refused[:500]}); "
           "this process runs without single-flight\n")
    return False
