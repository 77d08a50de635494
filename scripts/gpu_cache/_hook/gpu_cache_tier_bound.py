"""gpu-cache's startup hook, the node-local tier's bound (issue 23; ``gpu_cache_tier``): at
exit, at most once per ``TRIM_EVERY`` seconds per node (the stamp file's mtime in the local
tier) and only where nobody else trims now (a non-blocking ``flock``; someone else trims: this
process skips), the local tier is cut to ``$GPU_CACHE_TIER_MAX_BYTES``, least recently used
whole entries first: a JAX entry (its ``-cache`` and ``-atime`` files), a Triton key folder
(its group files removed first: a reader sees a miss, never a group without its children), a
file of XLA's autotune folder or of Inductor's tree. An entry used within ``IN_USE`` seconds
is kept (a process may be reading it). Standard library only, Python 3.9+.
"""

import errno
import os
import stat
import time

from sitecustomize import TEMP_PREFIX, TRIM_LOCK, TRIM_STAMP, XLA_AUTOTUNE_CACHE

TRIM_EVERY = 600.0
#: Entries used within this many seconds are in use now: never trimmed.
IN_USE = 60.0
#: A temporary file of the local tier older than this was left by a killed process.
STALE_TMP = 3600.0
#: At most this many files of a tree kind (Inductor, XLA's autotune folder) are looked at once.
MAX_TREE_FILES = 20000


def trim(root, max_bytes, now=None):
    """Cut the local tier ``root`` to ``max_bytes``. Returns the entries removed (None: not
    this time). Raises OSError."""
    import fcntl

    now = time.time() if now is None else now
    try:
        if now - os.stat(os.path.join(root, TRIM_STAMP), follow_symlinks=False).st_mtime < TRIM_EVERY:
            return None
    except FileNotFoundError:
        pass
    fd = os.open(os.path.join(root, TRIM_LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                 | os.O_NONBLOCK, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return None  # another process trims now
            raise
        stamp = os.path.join(root, TRIM_STAMP)
        try:
            if now - os.stat(stamp, follow_symlinks=False).st_mtime < TRIM_EVERY:
                return None  # it just did
        except FileNotFoundError:
            os.close(os.open(stamp, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        os.utime(stamp, (now, now), follow_symlinks=False)
        entries = _local_entries(root, now)
        total = sum(size for _used, size, _remove in entries)
        removed = 0
        for used, size, remove in sorted(entries, key=lambda entry: entry[0]):
            if total <= max_bytes:
                break
            if now - used < IN_USE:
                continue
            remove()
            total -= size
            removed += 1
        return removed
    finally:
        os.close(fd)


_SKIP_DIRS = ("locks",)


def tree_files(root):
    """Relative paths of the regular files under ``root`` (no links followed; no hidden,
    temporary or lock files), at most MAX_TREE_FILES."""
    out = []
    stack = [""]
    while stack and len(out) < MAX_TREE_FILES:
        rel = stack.pop()
        try:
            listing = list(os.scandir(os.path.join(root, rel)))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for item in listing:
            name = item.name
            if name.startswith(".") or name.endswith((".tmp", ".lock")) or ".tmp" in name:
                continue
            if item.is_dir(follow_symlinks=False):
                if name not in _SKIP_DIRS:
                    stack.append(os.path.join(rel, name))
            elif item.is_file(follow_symlinks=False):
                out.append(os.path.join(rel, name))
                if len(out) >= MAX_TREE_FILES:
                    break
    return out



def _local_entries(root, now):
    """``(last used, bytes, remove)`` for each whole entry of the local tier: a JAX entry (its
    ``-cache`` and ``-atime`` files), a Triton key folder, a file of XLA's autotune folder or of
    Inductor's tree. Temporary files of the tier left by a killed process are removed here."""
    entries = []
    jax = os.path.join(root, "jax")
    for item in _scan(jax):
        name = item.name
        info = _lstat(item)
        if info is None:
            continue
        if name.startswith(TEMP_PREFIX):
            if now - info.st_mtime > STALE_TMP:
                _unlink(item.path)
        elif name.endswith("-cache") and stat.S_ISREG(info.st_mode):
            atime = item.path[:-len("-cache")] + "-atime"
            extra = _lstat_path(atime)
            entries.append((max(info.st_mtime, extra.st_mtime if extra else 0),
                            info.st_size + (extra.st_size if extra else 0),
                            _remover([item.path, atime])))
    for folder in (os.path.join(jax, XLA_AUTOTUNE_CACHE), os.path.join(root, "inductor")):
        for rel in tree_files(folder):
            path = os.path.join(folder, rel)
            info = _lstat_path(path)
            if info is not None:
                entries.append((info.st_mtime, info.st_size, _remover([path])))
    for item in _scan(os.path.join(root, "triton")):
        info = _lstat(item)
        if info is None:
            continue
        if item.name.startswith(TEMP_PREFIX):
            if now - info.st_mtime > STALE_TMP:
                _unlink(item.path)
            continue
        if not stat.S_ISDIR(info.st_mode):
            continue
        used, size, files = info.st_mtime, 0, []
        for child in _scan(item.path):
            child_info = _lstat(child)
            if child_info is None or not stat.S_ISREG(child_info.st_mode):
                continue
            used, size = max(used, child_info.st_mtime), size + child_info.st_size
            files.append(child.path)
        # group files first: a reader then sees a miss, never a group without its children
        files.sort(key=lambda path: not os.path.basename(path).startswith("__grp__"))
        entries.append((used, size, _remover(files, folder=item.path)))
    return entries


def _scan(folder):
    try:
        return list(os.scandir(folder))
    except OSError:
        return []


def _lstat(item):
    try:
        return item.stat(follow_symlinks=False)
    except OSError:
        return None


def _lstat_path(path):
    try:
        return os.lstat(path)
    except OSError:
        return None


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def _remover(paths, folder=None):
    def remove():
        for path in paths:
            _unlink(path)
        if folder is not None:
            try:
                os.rmdir(folder)
            except OSError:
                pass  # a file appeared meanwhile: kept
    return remove
