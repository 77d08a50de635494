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

import os
import stat

from . import common, owners
from .names import NODE_LOCAL_PREFIX, RECORDS_VAR, TIER_VAR
from .owners import ACL_ACCESS, ACL_DEFAULT, private_group

_WRITERS = {owners.ACL_USER: "user {}", owners.ACL_GROUP: "group {}",
            owners.ACL_GROUP_OBJ: "group {} (its owning group)", owners.ACL_OTHER: "everyone (other)"}


def _distrust_one(path):
    info = os.stat(path)
    if not stat.S_ISDIR(info.st_mode):
        return f"{path} is not a folder"
    if info.st_uid not in (os.geteuid(), 0):
        return f"{path} is owned by user {info.st_uid}, not by you"
    mode = stat.S_IMODE(info.st_mode)
    acls = [(name, owners.read_acl(path, name)) for name in (ACL_ACCESS, ACL_DEFAULT)]
    access = acls[0][1]
    group_writes = owners.group_obj_writes(access) if access else bool(mode & stat.S_IWGRP)
    if mode & stat.S_IWOTH:
        return f"{path} is world-writable"
    if group_writes and not private_group(info.st_uid, info.st_gid):
        return f"{path} is writable by group {info.st_gid}"
    for name, entries in acls:
        found = owners.acl_writers(entries, info.st_uid, info.st_gid)
        writers = [_WRITERS[tag].format(who) for tag, who in found]
        if writers:
            which = "an ACL" if name == ACL_ACCESS else "a default ACL"
            return f"{path} has {which} that lets {', '.join(writers)} write"
    return None


def distrust_above(top, team=None):
    """Why a folder above ``top`` lets another user swap it, or None (``team``: see
    ``owners.may_swap``). Raises OSError or ValueError where a folder cannot be inspected."""
    me = os.geteuid()
    for folder, entry in owners.ancestors(top):
        info = os.stat(folder)
        below = os.lstat(entry).st_uid
        who = owners.may_swap(info.st_mode, info.st_uid, info.st_gid, below, me, team)
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


def _tier_refused(tier, kinds):
    """Why the node-local tier ``tier`` may not be used on this node, or None: it, every folder
    above it and each of its ``kinds`` folders that exists pass the trust rule (made 0700 where
    missing, each checked before it is entered)."""
    why = _trusted_folders(common.missing_folders(tier) or [tier], mode=0o700) or distrust(tier)
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
