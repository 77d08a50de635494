"""What the pieces of gpu-cache's startup hook share (the package's docstring says which piece
does what): text and list limits, the owner rules, marking a hit entry used, the record's parts
for jax and triton, and the ways to single-flight and the tier. Standard library only, Python
3.9+."""

import errno
import os
import stat
import sys

from sitecustomize import LOCKS_VAR

#: At most this many entries in each list (and key_parts) of a record; the rest are counted.
MAX_ITEMS = 1000
#: At most this many characters in each name, key or argument a record keeps.
MAX_TEXT = 500


def text(value, limit=MAX_TEXT):
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[:limit] + "..."


def keep(stats, field, item):
    """Append to a record's list, up to MAX_ITEMS; count what does not fit."""
    items = stats[field]
    if len(items) < MAX_ITEMS:
        items.append(item)
    else:
        stats["dropped"][field] += 1


def team_gid(info):
    """The group of a team's folder (``info``: its stat), or None: gpu-cache makes the folders of
    a shared-group cache group-writable and never world-writable (mode 2770)."""
    mode = info.st_mode
    return info.st_gid if mode & stat.S_IWGRP and not mode & stat.S_IWOTH else None


def owner_problem(info, team):
    """Why the file or folder ``info`` (its stat) may hold what another user put there, or None:
    it must be this user's or root's (or, in the team's folder ``team``, of the team's group),
    and nobody else may write it (gpu_cache.jobenv.trust's rule, for one file)."""
    in_team = team is not None and info.st_gid == team
    if info.st_uid not in (os.geteuid(), 0) and not in_team:
        return f"owned by uid {info.st_uid}"
    if info.st_mode & stat.S_IWOTH:
        return "writable by everyone"
    if info.st_mode & stat.S_IWGRP and not in_team:
        return f"writable by group {info.st_gid}"
    return None


def safe_mode(team, folder=False):
    """The mode of a file or folder this hook creates, whatever the umask: nobody but the user
    (and the team, in a team's folder) may write it."""
    if folder:
        return 0o2770 if team is not None else 0o700
    return 0o664 if team is not None else 0o644


def replace_whole(folder_fd, temp, name, data, mode):
    """``name`` in the folder ``folder_fd`` replaced whole by ``data``: the new file ``temp``
    (never through a link) with ``mode`` set after the umask had its say, then a rename; the
    temporary file is gone if anything fails."""
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                 dir_fd=folder_fd)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                if written <= 0:
                    raise OSError(errno.EIO, "short write", temp)
                view = view[written:]
        finally:
            os.close(fd)
        os.replace(temp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    except BaseException:
        try:
            os.unlink(temp, dir_fd=folder_fd)
        except OSError:
            pass
        raise


def make_folders(path):
    """Create ``path`` and the folders above it that are missing, each with :func:`safe_mode`
    of the folder it is made in (``os.makedirs`` leaves the folders above to the umask: 0777
    under umask 000)."""
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, safe_mode(team_gid(os.stat(os.path.dirname(folder))), folder=True))
        except FileExistsError:
            pass


def touch(path):
    """Mark a cache entry as used now (never through a symlink); a read-only cache just goes
    unmarked."""
    try:
        os.utime(path, follow_symlinks=False)
    except (OSError, NotImplementedError):
        pass


def jax_part(hook):
    """The record's ``jax`` part of this process, made on first use."""
    part = hook.parts.get("jax")
    if part is None:
        part = hook.parts["jax"] = {
            "requests": 0, "hits": 0, "writes": 0, "compile_seconds": 0.0, "saved_seconds": 0.0,
            "own_compile_seconds": 0.0, "load_seconds": 0.0,
            "hit_keys": [], "missed": [], "key_parts": {}, "key_context": {},
            "dropped": {"hit_keys": 0, "missed": 0, "key_parts": 0}}
    return part


def triton_part(hook):
    """The record's ``triton`` part of this process, made on first use."""
    part = hook.parts.get("triton")
    if part is None:
        part = hook.parts["triton"] = {
            "hits": 0, "misses": 0, "compile_seconds": 0.0, "hit_keys": [], "missed": [],
            "kernels": [], "autotuned": [], "unrecorded": [],
            "dropped": {"hit_keys": 0, "missed": 0, "kernels": 0, "autotuned": 0}}
    return part


def jax_cache_dir():
    """The cache folder this process's JAX really used: a program may set its own with
    ``jax.config.update("jax_compilation_cache_dir", ...)`` over the exported one."""
    try:
        folder = sys.modules["jax"].config.jax_compilation_cache_dir
    except Exception:
        return None
    return text(str(folder)) if folder else None


def flight(hook):
    """gpu-cache's single-flight module (``flight``), told how this hook warns."""
    module = hook.piece("flight")
    module.configure(hook.warn)
    return module


def flight_off(hook, kind, why):
    try:
        flight(hook).disable(kind, why)
    except Exception:
        pass


def flight_stats(hook, kind):
    """What single-flight did for ``kind``, for the record."""
    if not hook.flight:
        refused = hook.parts.get("fallbacks", {}).get("locks", {}).get("refused")
        return {"state": text(f"off: {refused}" if refused else f"off: {LOCKS_VAR} is not set", 300)}
    try:
        return flight(hook).stats(kind)
    except Exception as exc:
        return {"state": text(f"off: {exc!r}", 300)}


def tier(hook):
    """This process's node-local tier (``tier``), or None where it is off."""
    if not hook.tier:
        return None
    return hook.piece("tier").get(hook.warn)


def tier_stats(hook, kind):
    """What the tier did for ``kind``, for the record (None: the tier is off)."""
    try:
        found = tier(hook)
        return found.record(kind) if found is not None else None
    except Exception as exc:
        return {"state": text(f"off: {exc!r}", 300)}
