"""gpu-cache's startup hook, the node-local tier (issue 23): loaded when the process imports jax,
triton or torch._inductor and ``$GPU_CACHE_TIER`` and ``$GPU_CACHE_SHARED`` are absolute folders.

The job's JAX, Triton and Inductor caches work in ``$GPU_CACHE_TIER/<kind>`` (the local tier,
on the node's own disk); ``$GPU_CACHE_SHARED/<kind>`` (the cache root, often on a network
filesystem) is the shared tier. This module moves whole entries between them:

- **fetch**: an entry missing locally that the shared tier has is copied into a temporary file
  in the local kind folder, then linked to its name (never over an entry that is there);
  temporary files of both tiers are thus always ``<kind folder>/.gpu-cache-tmp.*``;
- **promote**: an entry this process just wrote locally is copied into a temporary file
  ``.gpu-cache-tmp.<host>.<pid>.<random>`` in the shared kind folder, then ``os.link``-ed to
  its name, which never replaces an existing entry and is atomic; where the filesystem has no
  hard links, ``os.rename`` only when the name is free. A Triton group's child files go first,
  its ``__grp__`` file last (Triton counts a group only when the group file and every child
  exist). A kill -9 at any point thus leaves at most a temporary file (prune removes old ones),
  never a partial entry, and loses no complete one.
- **bound**: at exit, the local tier is cut to ``$GPU_CACHE_TIER_MAX_BYTES``, least recently
  used whole entries first (``gpu_cache_tier_bound``).

Every shared and local kind folder is opened without following a link and used through its
descriptor; one that is not a folder of this user (or root; or the team's, where the shared
root is a group's) or that others can write is never read from nor written into: entries stay
local. A failure never reaches the job: that entry stays local (or is compiled), the record's
``tier`` part counts it, and the process prints one warning line at most. Standard library
only, Python 3.9+.
"""

import errno
import os
import stat
import threading
import time

import gpu_cache_tier_bound as bound

TIER_VAR = "GPU_CACHE_TIER"
SHARED_VAR = "GPU_CACHE_SHARED"
MAX_VAR = "GPU_CACHE_TIER_MAX_BYTES"
#: Test-only: a path the process creates when a promotion has written its temporary file and is
#: about to link it, after which it sleeps (tests kill it there, deterministically).
PAUSE_VAR = "GPU_CACHE_TIER_TEST_PAUSE"
TMP_PREFIX = bound.TMP_PREFIX
XLA_AUTOTUNE = bound.XLA_AUTOTUNE

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
#: Errors of os.link that mean "no hard links here": rename-if-absent instead.
_NO_LINK = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS)
_CHUNK = 1 << 20


class Refused(OSError):
    """A folder the tier may not use (not ours, writable by others, a link)."""


def _counts():
    return {"fetched": 0, "fetched_bytes": 0, "promoted": 0, "promoted_bytes": 0,
            "promote_failed": 0, "seconds": 0.0}


def _plain(name):
    """Whether ``name`` is one plain file name (no folder, no dot-entry, not ours)."""
    return (isinstance(name, str) and bool(name) and "/" not in name and "\0" not in name
            and name not in (".", "..") and not name.startswith(TMP_PREFIX))


def _folder_problem(info, team_gid):
    if not stat.S_ISDIR(info.st_mode):
        return "not a folder"
    ours = info.st_uid in (os.geteuid(), 0)
    team = team_gid is not None and info.st_gid == team_gid
    if not ours and not team:
        return f"owned by uid {info.st_uid}"
    if info.st_mode & stat.S_IWOTH:
        return "writable by everyone"
    if info.st_mode & stat.S_IWGRP and not team:
        return f"writable by group {info.st_gid}"
    return None


class _Side:
    """One tier's root (local or shared): its kind folders, opened by the trust rules once."""

    def __init__(self, root, create):
        self.root = root
        self.create = create  # make missing kind folders (the local tier: ours)
        self.fds = {}  # kind -> fd, or the Refused of that kind
        self.mutex = threading.Lock()
        self.team_gid = None
        try:
            info = os.stat(root)
            if info.st_mode & stat.S_IWGRP and not info.st_mode & stat.S_IWOTH:
                self.team_gid = info.st_gid  # a team's root (shared_group mode)
        except OSError:
            pass
        # the mode of the folders it makes (a Triton key, a tree's folders): as the tools
        # make them under a usual umask, never writable by others (the rules would refuse it)
        self.dir_mode = 0o700 if create else 0o775 if self.team_gid is not None else 0o755

    def folder(self, kind):
        """The descriptor of ``<root>/<kind>``. Raises Refused or OSError."""
        with self.mutex:
            return self._folder(kind)

    def _folder(self, kind):
        known = self.fds.get(kind)
        if isinstance(known, int):
            return known
        if known is not None:
            raise known
        path = os.path.join(self.root, kind)
        try:
            try:
                fd = os.open(path, _DIR)
            except FileNotFoundError:
                if not self.create:
                    raise
                os.makedirs(path, 0o700, exist_ok=True)
                fd = os.open(path, _DIR)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                exc = Refused(exc.errno, f"{path} is a link or not a folder")
            if isinstance(exc, Refused):
                self.fds[kind] = exc
            raise exc from None
        why = _folder_problem(os.fstat(fd), self.team_gid)
        if why:
            os.close(fd)
            refused = Refused(errno.EPERM, f"{path} is {why}")
            self.fds[kind] = refused
            raise refused
        self.fds[kind] = fd
        return fd

    def sub(self, kind, name, make):
        """The descriptor of the folder ``<root>/<kind>/<name>`` (a Triton key), checked like a
        kind folder; the caller closes it. Raises Refused or OSError (FileNotFoundError)."""
        parent = self.folder(kind)
        if make:
            try:
                os.mkdir(name, self.dir_mode, dir_fd=parent)
            except FileExistsError:
                pass
        try:
            fd = os.open(name, _DIR, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise Refused(exc.errno, f"{kind}/{name} is a link or not a folder") from None
            raise
        why = _folder_problem(os.fstat(fd), self.team_gid)
        if why:
            os.close(fd)
            raise Refused(errno.EPERM, f"{kind}/{name} is {why}")
        return fd


class Tier:
    """The tier of this process: where the two tiers are, what it moved, what is off."""

    XLA_AUTOTUNE = XLA_AUTOTUNE

    def __init__(self, local, shared, max_bytes, warn):
        self.local = _Side(local, create=True)
        self.shared = _Side(shared, create=False)
        self.max_bytes = max_bytes
        self.warn = warn
        self.stats = {}
        self.off = {}  # kind -> why the tier is off for it
        self.known = {}  # tree kind folder -> names known to be in the shared tier
        self.mutex = threading.Lock()
        self.pid = os.getpid()
        self.host = "".join(c if c.isalnum() or c in "-_" else "_" for c in os.uname().nodename)[:64]

    # --- what the record says ------------------------------------------------------------

    def counts(self, kind):
        with self.mutex:
            return self.stats.setdefault(kind, _counts())

    def disable(self, kind, why):
        self.off.setdefault(kind, str(why)[:300])

    def enabled(self, kind):
        return kind not in self.off

    def record(self, kind):
        """The record's ``tier`` part of ``kind``."""
        out = dict(self.counts(kind))
        out["seconds"] = round(out["seconds"], 3)
        out["local"] = os.path.join(self.local.root, kind)
        out["shared"] = os.path.join(self.shared.root, kind)
        if kind in self.off:
            out["state"] = f"off: {self.off[kind]}"
        elif f"{kind}:promote" in self.off:
            out["state"] = f"on, promotion off: {self.off[kind + ':promote']}"
        else:
            out["state"] = "on"
        return out

    def local_folder(self, kind):
        return os.path.join(self.local.root, kind)

    def shared_folder(self, kind):
        return os.path.join(self.shared.root, kind)

    def failed(self, what, exc):
        """The process's one warning line (the hook's, printed once at most)."""
        if self.warn is not None:
            self.warn(f"node-local tier ({what}); entries stay local", exc)

    # --- moving one file -------------------------------------------------------------------

    def _place(self, src_fd, src_name, tmp_fd, dst_fd, dst_name, check=None, pause=False,
               rewrite=None):
        """Copy ``src_name`` (in folder ``src_fd``) to a temporary file in ``tmp_fd``, then give
        it the name ``dst_name`` in ``dst_fd`` without replacing anything there. Returns the
        bytes placed, 0 when the name was taken meanwhile or the source is not whole (``check``)
        or not a regular file. Raises OSError."""
        try:
            fd = os.open(src_name, _READ, dir_fd=src_fd)
        except FileNotFoundError:
            return 0
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or (check is not None and not check(fd, info.st_size)):
                return 0
            if rewrite is not None:
                data = rewrite(_read_all(fd, info.st_size))
                if data is None:
                    return 0
                chunks = [data]
            else:
                chunks = None
            tmp = f"{TMP_PREFIX}{self.host}.{os.getpid()}.{os.urandom(6).hex()}"
            out = os.open(tmp, _CREATE, 0o666, dir_fd=tmp_fd)
            try:
                try:
                    _harden(out, os.fstat(tmp_fd))
                    size = _write_all(out, chunks) if chunks is not None else _copy_fd(fd, out)
                finally:
                    os.close(out)
                if chunks is None and size != info.st_size:
                    raise OSError(errno.EIO, f"{src_name} changed while it was copied")
                if pause:
                    _pause_for_tests()
                placed = _link_new(tmp, tmp_fd, dst_fd, dst_name)
            finally:
                try:
                    os.unlink(tmp, dir_fd=tmp_fd)
                except OSError:
                    pass
            return size if placed else 0
        finally:
            os.close(fd)

    def fetch(self, kind, name, check=None):
        """Copy the shared entry ``<kind>/<name>`` (one file) into the local tier when it is
        missing there. Whether the local tier has it now. Never raises."""
        if kind in self.off:
            return False
        started = time.monotonic()
        try:
            local = self.local.folder(kind)
            try:
                os.stat(name, dir_fd=local, follow_symlinks=False)
                return True
            except FileNotFoundError:
                pass
            size = self._place(self.shared.folder(kind), name, local, local, name, check)
        except FileNotFoundError:
            return False
        except Exception as exc:  # never into the job: the entry stays where it is
            self._refused(kind, exc, fetching=True)
            return False
        self._fetched(kind, size, started)
        return bool(size) or _exists(self.local, kind, name)

    def promote(self, kind, name, check=None):
        """Promote the local entry ``<kind>/<name>`` (one file) to the shared tier, unless it
        is there. Whether the shared tier has it now. Never raises."""
        if not self.promoting(kind):
            self.counts(kind)["promote_failed"] += 1
            return False
        started = time.monotonic()
        try:
            shared = self.shared.folder(kind)
            size = self._place(self.local.folder(kind), name, shared, shared, name, check,
                               pause=True)
        except Exception as exc:  # never into the job: the entry stays where it is
            self._refused(kind, exc)
            self.counts(kind)["promote_failed"] += 1
            return False
        self._promoted(kind, size, started)
        return True

    def _fetched(self, kind, size, started):
        if size:
            stats = self.counts(kind)
            stats["fetched"] += 1
            stats["fetched_bytes"] += size
            stats["seconds"] += time.monotonic() - started

    def _promoted(self, kind, size, started):
        stats = self.counts(kind)
        if size:
            stats["promoted"] += 1
            stats["promoted_bytes"] += size
        stats["seconds"] += time.monotonic() - started

    def _refused(self, kind, exc, fetching=False):
        """A kind folder the rules refuse, a filesystem error, or any other failure: warn
        once. A refused kind folder turns the tier off for the kind, a read-only (or full, or
        not writable) shared one promotion (copy-in goes on); other errors count per entry."""
        if isinstance(exc, Refused):
            self.disable(kind, exc.strerror)
        elif not fetching and getattr(exc, "errno", None) in (errno.EROFS, errno.EACCES, errno.EPERM,
                                                               errno.ENOSPC, errno.EDQUOT):
            self.off.setdefault(f"{kind}:promote", exc.strerror or repr(exc))
        self.failed(kind, exc)

    def promoting(self, kind):
        return kind not in self.off and f"{kind}:promote" not in self.off

    # --- Triton: key folders with a group file ---------------------------------------------

    def fetch_group(self, key, group_name, local_dir):
        """Copy the shared Triton group ``<key>/<group_name>`` (its children, then its group
        file, with the child paths made local) into the local tier. Whether it is there now.
        Never raises."""
        return self._fetch_key(key, group_name=group_name, local_dir=local_dir)

    def fetch_key_file(self, key, name):
        """Copy one shared file ``<key>/<name>`` of Triton's (a launcher ``.so``, an
        ``*.autotune.json``) into the local tier. Whether it is there now. Never raises."""
        return self._fetch_key(key, names=(name,))

    def _fetch_key(self, key, names=(), group_name=None, local_dir=None):
        """Copy the shared Triton files ``<key>/<names>`` (with ``group_name``: the group's
        children) missing locally, then the group file with its child paths made local ones.
        Whether they are all there now. Never raises."""
        kind = "triton"
        plain = all(_plain(n) for n in names) and (group_name is None or _plain(group_name))
        if kind in self.off or not _plain(key) or not plain:
            return False
        started = time.monotonic()
        src = dst = None
        try:
            src = self.shared.sub(kind, key, make=False)
            if group_name is not None:
                names = _group_children(src, group_name)
                if names is None:
                    return False
            dst = self.local.sub(kind, key, make=True)
            size = 0
            for name in names:
                try:
                    os.stat(name, dir_fd=dst, follow_symlinks=False)
                    continue
                except FileNotFoundError:
                    pass
                placed = self._place(src, name, self.local.folder(kind), dst, name)
                if not placed and not _exists_at(dst, name):
                    return False
                size += placed
            if group_name is not None:
                size += self._place(src, group_name, self.local.folder(kind), dst, group_name,
                                    rewrite=lambda data: _rewrite_group(data, local_dir))
        except FileNotFoundError:
            return False
        except Exception as exc:  # never into the job: the entry stays where it is
            self._refused(kind, exc, fetching=True)
            return False
        finally:
            for fd in (src, dst):
                if fd is not None:
                    os.close(fd)
        self._fetched(kind, size, started)
        return True

    def promote_key_files(self, key, names, group_name=None, shared_dir=None):
        """Promote the local Triton files ``<key>/<names>``, then (``group_name``) the group
        file with its child paths made shared ones, only when every child is in the shared tier.
        Never raises."""
        kind = "triton"
        if not self.promoting(kind) or not _plain(key) or not all(_plain(n) for n in names):
            self.counts(kind)["promote_failed"] += 1
            return False
        started = time.monotonic()
        src = dst = None
        size = 0
        try:
            shared = self.shared.folder(kind)
            src = self.local.sub(kind, key, make=False)
            dst = self.shared.sub(kind, key, make=True)
            for name in names:
                placed = self._place(src, name, shared, dst, name, pause=True)
                if not placed and not _exists_at(dst, name):
                    raise OSError(errno.ENOENT, f"{key}/{name} could not be promoted")
                size += placed
            if group_name is not None and _plain(group_name):
                size += self._place(src, group_name, shared, dst, group_name, pause=True,
                                    rewrite=lambda data: _rewrite_group(data, shared_dir))
        except Exception as exc:  # never into the job: the entry stays where it is
            self._refused(kind, exc)
            self.counts(kind)["promote_failed"] += 1
            return False
        finally:
            for fd in (src, dst):
                if fd is not None:
                    os.close(fd)
        self._promoted(kind, size, started)
        return True

    # --- trees: XLA's autotune folder, Inductor --------------------------------------------

    def fetch_tree(self, kind, sub=""):
        """Copy the files of the shared ``<kind>/<sub>`` tree missing locally (at most
        bound.MAX_TREE_FILES looked at). Never raises."""
        if kind in self.off:
            return
        started = time.monotonic()
        fetched = size = 0
        try:
            shared_root = os.path.join(self.shared_folder(kind), sub)
            local_root = os.path.join(self.local_folder(kind), sub)
            self.shared.folder(kind)  # the rules, for the kind folder
            known = self.known.setdefault((kind, sub), set())
            for rel in bound.tree_files(shared_root):
                known.add(rel)
                if os.path.lexists(os.path.join(local_root, rel)):
                    continue
                folder, name = os.path.split(rel)
                src = _open_below(self.shared, kind, os.path.join(sub, folder), make=False)
                dst = _open_below(self.local, kind, os.path.join(sub, folder), make=True)
                try:
                    placed = self._place(src, name, self.local.folder(kind), dst, name)
                finally:
                    os.close(src)
                    os.close(dst)
                fetched += bool(placed)
                size += placed
        except FileNotFoundError:
            pass
        except Exception as exc:  # never into the job: the entry stays where it is
            self._refused(kind, exc, fetching=True)
        stats = self.counts(kind)
        stats["fetched"] += fetched
        stats["fetched_bytes"] += size
        stats["seconds"] += time.monotonic() - started

    def promote_tree(self, kind, sub="", skip=None):
        """Promote the local ``<kind>/<sub>`` files that the shared tier lacks (as far as this
        process knows: what it saw there or promoted), except those below the folder ``skip``.
        Never raises."""
        if not self.promoting(kind):
            return
        started = time.monotonic()
        known = self.known.setdefault((kind, sub), set())
        local_root = os.path.join(self.local_folder(kind), sub)
        size = promoted = 0
        try:
            for rel in bound.tree_files(local_root):
                if rel in known or (skip and rel.startswith(skip.rstrip(os.sep) + os.sep)):
                    continue
                folder, name = os.path.split(rel)
                src = _open_below(self.local, kind, os.path.join(sub, folder), make=False)
                dst = _open_below(self.shared, kind, os.path.join(sub, folder), make=True)
                try:
                    placed = self._place(src, name, self.shared.folder(kind), dst, name, pause=True)
                finally:
                    os.close(src)
                    os.close(dst)
                known.add(rel)
                promoted += bool(placed)
                size += placed
        except FileNotFoundError:
            pass
        except Exception as exc:  # never into the job: the entry stays where it is
            self._refused(kind, exc)
            self.counts(kind)["promote_failed"] += 1
        stats = self.counts(kind)
        stats["promoted"] += promoted
        stats["promoted_bytes"] += size
        stats["seconds"] += time.monotonic() - started

    # --- the bound ---------------------------------------------------------------------------

    def trim(self, now=None):
        """The bound (``gpu_cache_tier_bound``). Never raises."""
        if not self.max_bytes or self.max_bytes <= 0:
            return None
        try:
            return bound.trim(self.local.root, self.max_bytes, now)
        except Exception as exc:
            self.failed("trimming the local tier", exc)
            return None


    def at_exit(self):
        """Promote what is left (XLA's autotune files, Inductor's), then the bound."""
        if os.getpid() != self.pid:  # a forked child: its parent does this
            return
        if self.known.get(("jax", XLA_AUTOTUNE)) is not None:
            self.promote_tree("jax", XLA_AUTOTUNE)
        if self.known.get(("inductor", "")) is not None:
            self.promote_tree("inductor")
        self.trim()


# --- helpers -----------------------------------------------------------------------------

def _pause_for_tests():
    where = os.environ.get(PAUSE_VAR)
    if where and os.path.isabs(where):
        os.close(os.open(where, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
        time.sleep(120)


def _harden(fd, folder):
    """No write for others (nor for the group, unless ``folder`` is a team's) on a file the tier
    just made, whatever the umask let through (gpu_cache.core.safe_io.harden's rule)."""
    mode = stat.S_IMODE(os.fstat(fd).st_mode)
    team = folder.st_mode & stat.S_IWGRP and not folder.st_mode & stat.S_IWOTH
    safe = mode & ~(0o002 if team else 0o022)
    if safe != mode:
        os.fchmod(fd, safe)


def _copy_fd(src, dst):
    size = 0
    while True:
        chunk = os.read(src, _CHUNK)
        if not chunk:
            return size
        size += _write_all(dst, [chunk])


def _write_all(fd, chunks):
    size = 0
    for chunk in chunks:
        view = memoryview(chunk)
        while view:
            written = os.write(fd, view)
            if written <= 0:
                raise OSError(errno.EIO, "short write")
            view = view[written:]
            size += written
    return size


def _read_all(fd, size, limit=1 << 20):
    """The content of a small file (a Triton group file)."""
    if size > limit:
        raise OSError(errno.EFBIG, "a Triton group file over 1 MiB")
    chunks = []
    while True:
        chunk = os.read(fd, limit)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _link_new(tmp, tmp_fd, dst_fd, name):
    """Give the file ``tmp`` the name ``name`` when that name is free: a hard link (atomic,
    never over an existing file), or where links are not supported a rename when the name is
    free. Whether it was placed."""
    try:
        os.link(tmp, name, src_dir_fd=tmp_fd, dst_dir_fd=dst_fd, follow_symlinks=False)
        return True
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in _NO_LINK:
            raise
    if _exists_at(dst_fd, name):
        return False
    os.rename(tmp, name, src_dir_fd=tmp_fd, dst_dir_fd=dst_fd)
    return True


def _exists_at(folder_fd, name):
    try:
        os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
        return True
    except OSError:
        return False


def _exists(side, kind, name):
    try:
        return _exists_at(side.folder(kind), name)
    except OSError:
        return False


def _open_below(side, kind, rel, make):
    """The descriptor of the folder ``<kind>/<rel>`` of ``side``, walked one name at a time
    without following a link (made where missing and ``make``), each checked by the rules."""
    fd = os.dup(side.folder(kind))
    try:
        for name in [part for part in rel.split(os.sep) if part]:
            if name in (".", ".."):
                raise Refused(errno.EPERM, f"{rel} is not a plain path")
            if make:
                try:
                    os.mkdir(name, side.dir_mode, dir_fd=fd)
                except FileExistsError:
                    pass
            sub = os.open(name, _DIR, dir_fd=fd)
            os.close(fd)
            fd = sub
            why = _folder_problem(os.fstat(fd), side.team_gid)
            if why:
                raise Refused(errno.EPERM, f"{kind}/{rel} is {why}")
        return fd
    except BaseException:
        os.close(fd)
        raise


#: Names a tree sync never copies: locks, temporary files of the tools and of the tier.
def _group_children(folder_fd, group_name):
    """The child file names a Triton group file lists (each must be a plain name), or None."""
    import json

    try:
        fd = os.open(group_name, _READ, dir_fd=folder_fd)
    except FileNotFoundError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        children = json.loads(_read_all(fd, info.st_size)).get("child_paths")
    except (ValueError, AttributeError):
        return None
    finally:
        os.close(fd)
    if not isinstance(children, dict) or not all(isinstance(p, str) for p in children.values()):
        return None
    names = [os.path.basename(p) for p in children.values()]
    return names if all(_plain(n) for n in names) else None


def _rewrite_group(data, folder):
    """A Triton group file's content with each child path moved into ``folder`` (Triton lists
    children by absolute path: a group copied elsewhere must name the copies)."""
    import json

    try:
        children = json.loads(data).get("child_paths")
    except (ValueError, AttributeError):
        return None
    if not isinstance(children, dict) or not all(isinstance(p, str) for p in children.values()):
        return None
    moved = {c: os.path.join(folder, os.path.basename(p)) for c, p in children.items()}
    return json.dumps({"child_paths": moved}).encode()


#: For the jax-triton kernel store (issue 34, ``gpu_cache_jax_triton_store``), which opens its
#: folder and places its entries by the same rules.
Side = _Side
link_new = _link_new


# --- the process's tier ------------------------------------------------------------------

_TIER = None
_INIT = threading.Lock()


def configured(environ):
    """``(local, shared, max_bytes)`` from the environment, or None when the tier is off."""
    local, shared = environ.get(TIER_VAR) or "", environ.get(SHARED_VAR) or ""
    if not (os.path.isabs(local) and os.path.isabs(shared)):
        return None
    try:
        max_bytes = int(environ.get(MAX_VAR) or 0)
    except ValueError:
        max_bytes = 0
    return os.path.normpath(local), os.path.normpath(shared), max_bytes


def get(warn=None):
    """This process's tier (made on first use, its exit work registered then), or None."""
    global _TIER
    if _TIER is None:
        with _INIT:
            if _TIER is None:
                found = configured(os.environ)
                if found is None:
                    return None
                import atexit

                _TIER = Tier(*found, warn)
                atexit.register(_TIER.at_exit)
    return _TIER
