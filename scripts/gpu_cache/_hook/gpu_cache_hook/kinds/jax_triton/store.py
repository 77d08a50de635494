"""gpu-cache's startup hook: the jax-triton kernel store (issue 34), used by
``kinds.jax_triton``.

One file per kernel in ``$GPU_CACHE_JAX_TRITON`` (the layout is
``gpu_cache.core.kinds.jax_triton_format``'s). An entry holds GPU code that the job will run, so:

- the folder is opened without following a link and used through its descriptor, and only
  when it is this user's (or root's; or the team's, where the cache root is a group's) and
  nobody else can write it (``tier.files.Side``'s rules, the tier's); ``gpu-cache env``
  checked the folders above it when it exported it;
- an entry is read only when it is a regular file (never through a link, never a FIFO) of at
  most ``ENTRY_LIMIT`` bytes that no other user could have written (``owner_problem``: this
  user's or root's, or the team's in a team's folder, and nobody else may write it), holding
  JSON of this format whose key is its file name, framed with its sha256 (``sealed``:
  ``digest``'s frame, written with the entry and checked on every read, so damage
  that keeps the size is found) and whose every field is of the type and range jaxlib's
  ``TritonKernel`` takes (``problem``); any other is set aside
  (``locks.set_aside``: renamed away, then removed), so it is not read again;
- an entry is written into a new temporary file, given mode 0644 (0664 in a team's folder)
  whatever the umask, then linked to its name, which never replaces an entry there: a reader
  sees a whole entry or none.

With the node-local tier on (``$GPU_CACHE_TIER``), the folder is the local tier's: a missing
entry is fetched from the shared tier first, and a new one promoted to it at once (before
single-flight lets the processes that wait for it go on). Standard library only, Python 3.9+.
"""

import errno
import hashlib
import json
import os
import re
import stat

from ... import digest as frame
from ... import locks as lock_files
from ...common import safe_mode
from ...names import TEMP_PREFIX
from ...owners import owner_problem
from ...tier import files as tier_files

KIND = "jax_triton"
#: The entries' format: which the host's inventory (gpu_cache.core.kinds.jax_triton_format)
#: imports from here. An entry larger than ENTRY_LIMIT is not read (an attention kernel's PTX is
#: a few hundred kB); MEMO_FOLDER keeps Triton's key of each installation.
FORMAT = 3
ENTRY_LIMIT = 64 << 20
MEMO_FOLDER = ".triton-keys"
#: Triton's key of an installation unused this long is removed when another one is kept.
MEMO_AGE = 30 * 86400

_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


#: The most shared memory one block may use on any NVIDIA GPU so far (227 KiB: sm_90, sm_100);
#: jaxlib takes a uint32, and the driver refuses more than the device has at the launch.
SHARED_LIMIT = 227 << 10
#: The most CTAs in a cluster (16, Hopper's non-portable size; jax-triton 0.2.0's cluster_dims).
CLUSTER_LIMIT = 16
#: The largest global scratch buffer (jax-triton 0.4) a kept kernel may ask jaxlib for: 4 GiB - 1,
#: a uint32, as ``shared_mem_bytes``.
SCRATCH_LIMIT = (1 << 32) - 1
_PTX_NAME = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]{0,1023}\Z")


class Unusable(Exception):
    """An entry is there but may not be used (the reason is the message; ``judged``: the
    stat of what was judged, to set it aside, or None)."""

    def __init__(self, why, judged=None):
        super().__init__(why)
        self.judged = judged


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
                why = owner_problem(os.fstat(fd), team, where=fd)
                if why:
                    raise tier_files.Refused(errno.EPERM, f"{MEMO_FOLDER} is {why}")
            except BaseException:
                os.close(fd)
                raise
            self._memos = fd
        return self._memos

    def read(self, name, limit=ENTRY_LIMIT, folder=None, check=None):
        """``(bytes, stat)`` of the file ``name`` (in the folder ``folder``: a descriptor;
        default the kernel folder, fetched from the shared tier first with the tier on, when
        ``check(fd, size)`` passes it), or None when there is none. Raises Unusable, OSError."""
        if folder is None:
            folder = self._fd()
            if self.tier is not None:
                self.tier.fetch(KIND, name, check)
        try:
            fd = os.open(name, _READ, dir_fd=folder)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENXIO, errno.EOPNOTSUPP):  # a link, a socket
                raise
        else:
            return self._read_open(fd, name, limit)
        try:
            judged = os.lstat(name, dir_fd=folder)
        except FileNotFoundError:
            return None
        raise Unusable(f"{name} is not a regular file", judged)

    def _read_open(self, fd, name, limit):
        try:
            info = os.fstat(fd)
            why = self._problem(fd, info, limit, self._side.team_gid)
            if why:
                raise Unusable(f"{name} {why}", info)
            data = _read_all(fd, info.st_size, info)
            try:
                os.utime(fd)  # used now: prune and the tier's bound keep it longer
            except OSError:
                pass  # a read-only cache: it goes unmarked
            return data, info
        finally:
            os.close(fd)

    @staticmethod
    def _problem(fd, info, limit, team):
        if not stat.S_ISREG(info.st_mode):
            return "is not a regular file"
        if info.st_size > limit:
            return f"is larger than {limit} bytes"
        why = owner_problem(info, team, where=fd)
        return f"is {why}: another user could have written it" if why else None

    def load(self, key, judge):
        """The entry ``key`` as a mapping, or None when there is none. One that is there and
        may not be used (not a whole entry of this format for its name, not as it was written,
        or ``judge(entry)`` names a problem) is set aside, here and, with the tier, in the
        shared tier, so that it is not read again: Unusable says why. Raises OSError."""
        shared = []  # why the shared tier's entry was not fetched

        def whole(fd, size):
            try:
                info = os.fstat(fd)
                why = self._problem(fd, info, ENTRY_LIMIT, self.tier.shared.team_gid)
                if why:
                    raise Unusable(f"{key} {why}", info)
                _judged(_pread_all(fd, size), key, judge, info)
            except Unusable as exc:
                where = self.tier.shared.folder(KIND)
                shared.append(f"{exc} (in the shared tier){self._set_aside(key, exc, where)}")
                return False
            return True

        try:
            found = self.read(key, check=whole)
            if found is None:
                if shared:
                    raise Unusable(shared[0])
                return None
            return _judged(found[0], key, judge, found[1])
        except Unusable as exc:
            if exc.judged is None:
                raise
            raise Unusable(f"{exc}{self._set_aside(key, exc, self._fd())}") from None

    def _set_aside(self, name, refused, folder):
        """Set the file ``name`` that ``refused`` judged aside in ``folder``; what the record
        says of it."""
        try:
            lock_files.set_aside(name, refused.judged, dir_fd=folder)
        except OSError as exc:  # a read-only folder: refused again next time
            return f"; left in place ({exc.strerror or exc!r})"
        return "; set aside"

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


def _read_all(fd, size, info=None, pread=False):
    chunks, total = [], 0
    while True:
        want = max(size - total, 0) + 1
        chunk = os.pread(fd, want, total) if pread else os.read(fd, want)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > ENTRY_LIMIT:
            raise Unusable(f"grew past {ENTRY_LIMIT} bytes while it was read", info)


def _pread_all(fd, size):
    """The content of the open file ``fd`` without moving its offset (the tier copies it
    next)."""
    return _read_all(fd, size, os.fstat(fd), pread=True)


# --- what an entry must be (its integrity: digest, shared with the ptxas shim) -----

def sealed(entry):
    """The bytes of ``entry`` as the store writes it: its JSON, framed with its sha256
    (``digest``). Raises ValueError (a value JSON cannot hold)."""
    return frame.framed(json.dumps(entry, allow_nan=False).encode("ascii"))


def _judged(data, key, judge, info):
    """The entry in ``data`` (the bytes of the file ``key``, ``info`` its stat). Raises
    Unusable: it is not as it was written (its sha256), not JSON of this format for its name,
    or ``judge(entry)`` names a problem."""
    try:
        body = frame.opened(data)
    except frame.Damaged as exc:
        raise Unusable(f"{key} is {exc}", info) from None
    if body is None:
        raise Unusable(f"{key} is not an entry of format {FORMAT} (an older gpu-cache's?)", info)
    try:
        entry = json.loads(body)
    except (ValueError, RecursionError):
        raise Unusable(f"{key} is not JSON", info) from None
    if not isinstance(entry, dict) or entry.get("format") != FORMAT or entry.get("key") != key:
        raise Unusable(f"{key} is not an entry of format {FORMAT} for its name", info)
    why = judge(entry)
    if why:
        raise Unusable(f"{key} {why}", info)
    return entry


def problem(entry, version, fields, target):
    """Why ``entry`` may not be handed to jaxlib by this jax-triton (``version``, whose
    ``CompilationResult`` has the fields ``fields``) for ``target`` (``sm_90``), or None: each
    field jaxlib's ``TritonKernel`` takes is checked for its type and range (a field this
    piece has no check for refuses the entry)."""
    if entry.get("jax_triton") != version:
        return f"was made by another jax-triton than {version}"
    ttir = entry.get("ttir")
    if not isinstance(ttir, str) or "tt.func" not in ttir:
        return "has no TTIR (jaxlib's TritonKernel takes it)"
    result = entry.get("result")
    if not isinstance(result, dict) or set(result) != set(fields):
        return "does not hold this jax-triton's CompilationResult fields"
    for field in sorted(fields, key=lambda f: f == "binary"):  # the binary's check reads the name
        check = _CHECKS.get(field)
        why = "has no check" if check is None else check(result[field], result, target)
        if why:
            return f"has a result field {field} that {why}"
    return None


def _binary(value, result, target):
    """jax-triton 0.2 and 0.3 hand jaxlib PTX on CUDA (jaxlib runs ptxas on it): PTX text for
    ``target`` that defines the kernel the result names."""
    if not isinstance(value, str) or "\0" in value or not re.search(r"^\.version \d+\.\d+\s*$", value, re.M):
        return "is not PTX"
    if not re.search(rf"^\.target {re.escape(target)}[a-z]?\b", value, re.M):
        return f"is not PTX for {target}"
    name = result.get("name")
    if not isinstance(name, str) or not re.search(rf"\.entry\s+{re.escape(name)}\s*\(", value):
        return "does not define the kernel it names"
    return None


def _name(value, _result, _target):
    return None if isinstance(value, str) and _PTX_NAME.match(value) else "is no PTX kernel name"


def _whole(value, low, high):
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _shared(value, _result, _target):
    return None if _whole(value, 0, SHARED_LIMIT) else f"is not a whole number from 0 to {SHARED_LIMIT}"


def _cluster(value, _result, _target):
    if isinstance(value, list) and len(value) == 3 and all(_whole(v, 1, CLUSTER_LIMIT) for v in value) \
            and value[0] * value[1] * value[2] <= CLUSTER_LIMIT:
        return None
    return f"is not three whole numbers of at most {CLUSTER_LIMIT} CTAs in all"


def _ir_text(value, _result, _target):
    # ttgir, llir: jax-triton 0.2 and 0.3 fill them only with JAX_TRITON_DUMP_DIR, 0.4 always;
    # only its dump writes them out, jaxlib never sees them
    return None if value is None or (isinstance(value, str) and "\0" not in value) else "is not text"


def _scratch_size(value, result, _target):
    # jax-triton 0.4: with a size, jaxlib > 0.11 takes the size and its alignment
    if value is None:
        return None if result.get("global_scratch_align") is None else "is null beside an alignment"
    if _whole(value, 0, SCRATCH_LIMIT):
        return None
    return f"is not null nor a whole number up to {SCRATCH_LIMIT}"


def _scratch_align(value, result, _target):
    if value is None:
        return None if result.get("global_scratch_size") is None else "is null beside a size"
    if _whole(value, 1, 1 << 16) and value & (value - 1) == 0:
        return None
    return "is not a power of two up to 65536"


def _no_descriptors(value, _result, _target):
    # jax-triton 0.4's tensor descriptors: a kernel that has any compiles in every process
    return None if value == [] else "is not empty"


_CHECKS = {"binary": _binary, "name": _name, "shared_mem_bytes": _shared, "cluster_dims": _cluster,
           "ttgir": _ir_text, "llir": _ir_text, "global_scratch_size": _scratch_size,
           "global_scratch_align": _scratch_align, "tensordesc_meta": _no_descriptors}


# --- Triton's own key, once per installation ----------------------------------------------

def installation_id(triton_folder):
    """What identifies a Triton installation's files: the path, inode, size and modification
    and change times of each ``.py`` and ``.so`` file below ``triton_folder`` (a change time
    moves on any write, and a reinstall makes new files). A sha256, 32 hex digits."""
    found = hashlib.sha256(os.fsencode(triton_folder) + b"\0")
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
                found.update(f"{item.path}\0{info.st_ino}\0{info.st_size}\0{info.st_mtime_ns}\0"
                             f"{info.st_ctime_ns}\n".encode("utf-8", "surrogateescape"))
    return found.hexdigest()[:32]


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
    if kept and kept[0]:
        try:
            stats["triton_key"] = "kept"
            return kept[0].decode("utf-8")
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
