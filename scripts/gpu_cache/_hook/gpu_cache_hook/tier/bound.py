"""gpu-cache's startup hook, the node-local tier's bound (issue 23; ``tier``): at
exit, at most once per ``TRIM_EVERY`` seconds per node (the stamp file's mtime in the local
tier) and only where nobody else trims now (a non-blocking ``flock``; someone else trims: this
process skips), the local tier is cut to ``$GPU_CACHE_TIER_MAX_BYTES``, least recently used
whole entries first. Each tiered kind's piece declares how its whole entries are found, as one
of the layouts of :data:`LAYOUTS` (``tier <layout> <word> ...``); an entry used within
``IN_USE`` seconds is kept (a process may be reading it). Standard library only, Python 3.9+.
"""

import errno
import os
import stat
import time

from ..names import TEMP_PREFIX, TRIM_LOCK, TRIM_STAMP

TRIM_EVERY = 600.0
#: Entries used within this many seconds are in use now: never trimmed.
IN_USE = 60.0
#: A temporary file of the local tier older than this was left by a killed process.
STALE_TMP = 3600.0
#: At most this many files of a ``files`` layout are looked at once.
MAX_TREE_FILES = 20000


def trim(root, max_bytes, layouts, now=None):
    """Cut the local tier ``root`` to ``max_bytes``, its entries found by ``layouts`` (``(kind,
    words of its layouts)``, as the pieces declare them). Returns the entries removed (None: not
    this time). Every name is reached from the tier's own descriptor, one folder at a time and
    never through a link, so nothing outside the tier is ever removed. Raises OSError,
    ValueError (a layout that is none of :data:`LAYOUTS`)."""
    import fcntl

    now = time.time() if now is None else now
    root_fd = os.open(root, _DIR)
    try:
        if _recent(root_fd, now):
            return None
        fd = os.open(TRIM_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                     0o600, dir_fd=root_fd)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    return None  # another process trims now
                raise
            if _recent(root_fd, now):
                return None  # it just did
            return _cut(root_fd, max_bytes, layouts, now)
        finally:
            os.close(fd)
    finally:
        os.close(root_fd)


def _recent(root_fd, now):
    """Whether the tier was trimmed within TRIM_EVERY seconds (a stamp dated in the future,
    by a clock that was wrong or by whoever could write it, counts as long ago)."""
    try:
        when = os.stat(TRIM_STAMP, dir_fd=root_fd, follow_symlinks=False).st_mtime
    except FileNotFoundError:
        return False
    return 0 <= now - when < TRIM_EVERY


def _cut(root_fd, max_bytes, layouts, now):
    try:
        os.close(os.open(TRIM_STAMP, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                         0o600, dir_fd=root_fd))
    except FileExistsError:
        pass
    os.utime(TRIM_STAMP, (now, now), dir_fd=root_fd, follow_symlinks=False)
    entries = []
    for kind, words in layouts:
        for layout in words:
            entries += _layout(kind, layout).entries(root_fd, now)
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


def _layout(kind, words):
    try:
        return LAYOUTS[words[0]](kind, *words[1:])
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"the tier layout of {kind} is none of {', '.join(LAYOUTS)}: {words}") from None


class _Pairs:
    """``pairs <suffix> <companion>``: an entry is a file ``<key><suffix>`` of the kind folder
    with its ``<key><companion>`` beside it (JAX's ``-cache`` and ``-atime``). Temporary files
    of the tier there left by a killed process are removed."""

    def __init__(self, kind, suffix, companion):
        self.kind, self.suffix, self.companion = kind, suffix, companion

    def entries(self, root_fd, now):
        found = []
        with _Folder(root_fd, (self.kind,)) as folder:
            for name, info in folder.files():
                if name.startswith(TEMP_PREFIX):
                    if now - info.st_mtime > STALE_TMP:
                        folder.unlink(name)
                elif name.endswith(self.suffix):
                    other = name[:-len(self.suffix)] + self.companion
                    extra = folder.lstat(other)
                    used = _when(max(info.st_mtime, extra.st_mtime if extra else 0), now)
                    found.append((used, info.st_size + (extra.st_size if extra else 0),
                                  _remover(root_fd, (self.kind,), [name, other])))
        return found


class _Files:
    """``files [<folder>]``: every regular file below the kind folder (or its ``<folder>``) is an
    entry; no hidden, temporary or lock file, at most MAX_TREE_FILES (XLA's autotune results,
    Inductor's tree, jax-triton's kernels)."""

    def __init__(self, kind, *below):
        self.parts = (kind, *below)

    def entries(self, root_fd, now):
        return [(_when(info.st_mtime, now), info.st_size, _remover(root_fd, folder, [name]))
                for folder, name, info in _tree(root_fd, self.parts)]


class _KeyFolders:
    """``folders <prefix>``: every folder of the kind folder is an entry, its files whose names
    start with ``<prefix>`` removed first (a Triton key folder: its group files first, so that a
    reader sees a miss, never a group without its children). Temporary files of the tier there
    left by a killed process are removed."""

    def __init__(self, kind, first):
        self.kind, self.first = kind, first

    def entries(self, root_fd, now):
        found = []
        with _Folder(root_fd, (self.kind,)) as folder:
            for name, info in folder.items():
                if name.startswith(TEMP_PREFIX):
                    if stat.S_ISREG(info.st_mode) and now - info.st_mtime > STALE_TMP:
                        folder.unlink(name)
                elif stat.S_ISDIR(info.st_mode):
                    found.append(self._entry(root_fd, name, info, now))
        return found

    def _entry(self, root_fd, key, info, now):
        """The entry of the key folder ``key``: its newest time, its files' bytes, how to remove it."""
        used, size, files = info.st_mtime, 0, []
        with _Folder(root_fd, (self.kind, key)) as folder:
            for name, child in folder.files():
                used, size = max(used, child.st_mtime), size + child.st_size
                files.append(name)
        files.sort(key=lambda name: not name.startswith(self.first))
        return _when(used, now), size, _remover(root_fd, (self.kind, key), files, rmdir=True)


#: The layouts a tiered kind's piece may declare (``tier <layout> <word> ...``), each a class
#: whose ``entries(root_fd, now)`` are the kind's whole entries in the local tier: ``(last used,
#: bytes, remove)``. A time in the future (beyond IN_USE: a clock set wrong, or a date someone
#: planted) counts as the oldest, never as in use.
LAYOUTS = {"pairs": _Pairs, "files": _Files, "folders": _KeyFolders}


def _when(used, now):
    return 0.0 if used > now + IN_USE else used


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _Folder:
    """A folder of the tier reached from its descriptor one name at a time, never through a
    link; a folder that is missing or is no folder has no items."""

    def __init__(self, root_fd, parts):
        self.root_fd, self.parts, self.fd = root_fd, parts, None

    def __enter__(self):
        fd = os.dup(self.root_fd)
        try:
            for name in self.parts:
                sub = os.open(name, _DIR, dir_fd=fd)
                os.close(fd)
                fd = sub
        except OSError:
            os.close(fd)
            return self
        self.fd = fd
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)

    def items(self):
        """``(name, lstat)`` of everything in it."""
        if self.fd is None:
            return []
        out = []
        try:
            names = os.listdir(self.fd)
        except OSError:
            return []
        for name in names:
            info = self.lstat(name)
            if info is not None:
                out.append((name, info))
        return out

    def files(self):
        return [(name, info) for name, info in self.items() if stat.S_ISREG(info.st_mode)]

    def lstat(self, name):
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except OSError:
            return None

    def unlink(self, name):
        try:
            os.unlink(name, dir_fd=self.fd)
        except OSError:
            pass


def _tree(root_fd, parts, limit=MAX_TREE_FILES):
    """``(folder parts, name, lstat)`` of each regular file under ``parts`` (no links followed;
    no hidden, temporary or lock files), at most ``limit``."""
    out, stack = [], [tuple(parts)]
    while stack and len(out) < limit:
        folder = stack.pop()
        with _Folder(root_fd, folder) as here:
            for name, info in here.items():
                if name.startswith(".") or name.endswith((".tmp", ".lock")) or ".tmp" in name:
                    continue
                if stat.S_ISDIR(info.st_mode) and name not in _SKIP_DIRS:
                    stack.append((*folder, name))
                elif stat.S_ISREG(info.st_mode) and len(out) < limit:
                    out.append((folder, name, info))
    return out


def _remover(root_fd, parts, names, rmdir=False):
    """Remove ``names`` from the tier's folder ``parts`` (then the folder, when ``rmdir`` and
    it is empty), reached again from the tier's descriptor at the time of removal."""
    def remove():
        with _Folder(root_fd, parts) as folder:
            if folder.fd is None:
                return
            for name in names:
                folder.unlink(name)
        if rmdir:
            with _Folder(root_fd, parts[:-1]) as parent:
                if parent.fd is not None:
                    try:
                        os.rmdir(parts[-1], dir_fd=parent.fd)
                    except OSError:
                        pass  # a file appeared meanwhile: kept
    return remove
