"""gpu-cache's startup hook: the jax-triton kernel store (issue 34), used by
``gpu_cache_hook_jax_triton``.

One file per kernel in ``$GPU_CACHE_JAX_TRITON`` (the layout is
``gpu_cache.core.caches.jax_triton``'s). An entry holds GPU code that the job will run, so:

- the folder is opened without following a link and used through its descriptor, and only
  when it is this user's (or root's; or the team's, where the cache root is a group's) and
  nobody else can write it (``gpu_cache_tier_files.Side``'s rules, the tier's); ``gpu-cache env``
  checked the folders above it when it exported it;
- an entry is read only when it is a regular file (never through a link, never a FIFO) of at
  most ``ENTRY_LIMIT`` bytes that no other user could have written (``owner_problem``: this
  user's or root's, or the team's in a team's folder, and nobody else may write it), holding
  JSON of this format whose key is its file name;
- an entry is written into a new temporary file, given mode 0644 (0664 in a team's folder)
  whatever the umask, then linked to its name, which never replaces an entry there: a reader
  sees a whole entry or none.

With the node-local tier on (``$GPU_CACHE_TIER``), the folder is the local tier's: a missing
entry is fetched from the shared tier first, and a new one promoted to it at once (before
single-flight lets the processes that wait for it go on). Standard library only, Python 3.9+.
"""

import errno
import json
import os
import stat

import gpu_cache_tier_files as tier_files
from gpu_cache_hook_common import owner_problem, safe_mode
from sitecustomize import TEMP_PREFIX

KIND = "jax_triton"
#: Copies of gpu_cache.core.caches.jax_triton's names (a test fails when they drift).
FORMAT = 1
ENTRY_LIMIT = 64 << 20
MEMO_FOLDER = ".triton-keys"
#: Triton's key of an installation unused this long is removed when another one is kept.
MEMO_AGE = 30 * 86400

_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Unusable(Exception):
    """An entry is there but may not be used (the reason is the message)."""


class Store:
    """The kernel folder of this process (``folder``), and the tier behind it (or None)."""

    def __init__(self, folder, tier):
        self.folder = os.path.normpath(folder)
        tiered = tier is not None and tier.enabled(KIND) and self.folder == tier.local_folder(KIND)
        self.tier = tier if tiered else None
        if self.tier is not None:
            self._side = self.tier.local
        else:
            root = os.path.dirname(self.folder)
            self._side = tier_files.Side(root, create=False)
        self._name = os.path.basename(self.folder) if self.tier is None else KIND
        self.host = "".join(c if c.isalnum() or c in "-_" else "_" for c in os.uname().nodename)[:64]
        self._memos = None

    def where(self):
        """The folder single-flight names its locks after: the shared one with the tier, so
        processes on every node agree."""
        return self.tier.shared_folder(KIND) if self.tier is not None else self.folder

    def _fd(self):
        """The folder's descriptor, opened by the rules. Raises tier_files.Refused, OSError."""
        return self._side.folder(self._name)

    def check(self):
        """Raise when the folder may not be used (Refused) or cannot be opened (OSError)."""
        self._fd()

    def memo_folder(self):
        """The descriptor of ``<folder>/.triton-keys`` (made where missing), checked like the
        folder: Triton's keys of installations, kept on this node (never fetched nor promoted:
        an installation's identity holds this node's inodes). Raises Refused, OSError."""
        if self._memos is None:
            parent, team = self._fd(), self._side.team_gid
            try:
                os.mkdir(MEMO_FOLDER, 0o700, dir_fd=parent)
                made = True
            except FileExistsError:
                made = False
            fd = os.open(MEMO_FOLDER, _DIR, dir_fd=parent)
            try:
                if made:
                    os.fchmod(fd, safe_mode(team, folder=True))
                why = owner_problem(os.fstat(fd), team)
                if why:
                    raise tier_files.Refused(errno.EPERM, f"{MEMO_FOLDER} is {why}")
            except BaseException:
                os.close(fd)
                raise
            self._memos = fd
        return self._memos

    def read(self, name, limit=ENTRY_LIMIT, folder=None):
        """The bytes of the file ``name`` (in the folder ``folder``: a descriptor; default the
        kernel folder, fetched from the shared tier first with the tier on), or None when there
        is none. Raises Unusable, OSError."""
        if folder is None:
            folder = self._fd()
            if self.tier is not None:
                self.tier.fetch(KIND, name)
        try:
            fd = os.open(name, _READ, dir_fd=folder)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR):
                raise Unusable(f"{name} is not a regular file") from None
            raise
        try:
            info = os.fstat(fd)
            why = self._problem(info, limit)
            if why:
                raise Unusable(f"{name} {why}")
            data = _read_all(fd, info.st_size)
            try:
                os.utime(fd)  # used now: prune and the tier's bound keep it longer
            except OSError:
                pass  # a read-only cache: it goes unmarked
            return data
        finally:
            os.close(fd)

    def _problem(self, info, limit):
        if not stat.S_ISREG(info.st_mode):
            return "is not a regular file"
        if info.st_size > limit:
            return f"is larger than {limit} bytes"
        why = owner_problem(info, self._side.team_gid)
        return f"is {why}: another user could have written it" if why else None

    def load(self, key):
        """The entry ``key`` as a mapping, or None when there is none. Raises Unusable (it is
        there and not a whole entry of this format), OSError."""
        data = self.read(key)
        if data is None:
            return None
        try:
            entry = json.loads(data)
        except ValueError:
            raise Unusable(f"{key} is not JSON") from None
        if not isinstance(entry, dict) or entry.get("format") != FORMAT or entry.get("key") != key:
            raise Unusable(f"{key} is not an entry of format {FORMAT} for its name")
        return entry

    def write(self, name, data, replace=False, folder=None):
        """Place ``data`` as the file ``name`` (in ``folder``, default the kernel folder): whole
        or not at all, never over a file there (``replace``: over one, which was found
        unusable). A kernel is promoted to the shared tier at once. Whether this process placed
        it. Raises OSError, tier_files.Refused."""
        promote = folder is None and self.tier is not None
        folder = self._fd() if folder is None else folder
        temp = f"{TEMP_PREFIX}{self.host}.{os.getpid()}.{os.urandom(6).hex()}"
        fd = os.open(temp, _CREATE, 0o600, dir_fd=folder)
        try:
            try:
                os.fchmod(fd, safe_mode(self._side.team_gid))
                tier_files.write_all(fd, [data])
            finally:
                os.close(fd)
            if replace:
                os.replace(temp, name, src_dir_fd=folder, dst_dir_fd=folder)
                placed = True
            else:
                placed = tier_files.link_new(temp, folder, folder, name)
        finally:
            try:
                os.unlink(temp, dir_fd=folder)
            except OSError:
                pass
        if promote:
            self.tier.promote(KIND, name)
        return placed


def _read_all(fd, size):
    chunks, total = [], 0
    while True:
        chunk = os.read(fd, max(size - total, 0) + 1)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > ENTRY_LIMIT:
            raise Unusable(f"grew past {ENTRY_LIMIT} bytes while it was read")


# --- Triton's own key, once per installation ----------------------------------------------

def installation_id(triton_folder):
    """What identifies a Triton installation's files: the path, inode, size and modification
    and change times of each ``.py`` and ``.so`` file below ``triton_folder`` (a change time
    moves on any write, and a reinstall makes new files). A sha256, 32 hex digits."""
    import hashlib

    digest = hashlib.sha256(os.fsencode(triton_folder) + b"\0")
    pending = [triton_folder]
    while pending:
        folder = pending.pop()
        with os.scandir(folder) as listing:
            items = sorted(listing, key=lambda item: item.name)
        for item in items:
            if item.is_dir(follow_symlinks=False):
                if item.name != "__pycache__":
                    pending.append(item.path)
            elif item.name.endswith((".py", ".so")):
                info = item.stat(follow_symlinks=False)
                digest.update(f"{item.path}\0{info.st_ino}\0{info.st_size}\0{info.st_mtime_ns}\0"
                              f"{info.st_ctime_ns}\n".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()[:32]


def triton_key(store, compute, triton_folder, stats):
    """Triton's key (``compute()``) of the installation at ``triton_folder``: read from the
    store where this installation's files are as they were when it was kept, else computed
    and kept. ``stats["triton_key"]`` says which."""
    name = installation_id(triton_folder)
    try:
        folder = store.memo_folder()
        kept = store.read(name, limit=1 << 20, folder=folder)
    except (Unusable, OSError):
        folder = kept = None
    if kept:
        try:
            stats["triton_key"] = "kept"
            return kept.decode("utf-8")
        except UnicodeDecodeError:
            pass
    value = compute()
    stats["triton_key"] = "computed"
    if folder is not None:
        try:
            store.write(name, value.encode("utf-8"), replace=kept is not None, folder=folder)
            _forget_old(folder, name)
        except OSError:
            pass  # kept next time, or computed again
    return value


def _forget_old(folder, kept):
    """Remove the keys of installations unused for MEMO_AGE (a few kB each: one per image or
    reinstall), never ``kept``."""
    import time

    now = time.time()
    with os.scandir(folder) as listing:
        for item in listing:
            try:
                if item.name != kept and now - item.stat(follow_symlinks=False).st_mtime > MEMO_AGE:
                    os.unlink(item.name, dir_fd=folder)
            except OSError:
                pass
