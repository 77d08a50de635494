"""Filesystem facts about a cache folder: can it be used, what is it on, is it trusted."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpu_cache.config.units import format_size
from gpu_cache.core import names, safe_io
from gpu_cache.core.errors import UsageError
from gpu_cache.core.owners import Team
from gpu_cache.jobenv import trust

#: Filesystem types (as /proc/mounts names them) shared over the network, by family.
NETWORK_FAMILIES = {
    "nfs": ("nfs", "nfs4"), "lustre": ("lustre",), "beegfs": ("beegfs",),
    "gpfs": ("gpfs",), "cifs": ("cifs", "smb3", "smbfs"), "ceph": ("ceph", "fuse.ceph"),
    "glusterfs": ("glusterfs", "fuse.glusterfs"), "sshfs": ("fuse.sshfs",), "panfs": ("panfs",),
    "wekafs": ("wekafs",),
}
NETWORK_FS = frozenset(name for names in NETWORK_FAMILIES.values() for name in names)
#: Node-local filesystems held in memory (lost at reboot, counted against the job's memory).
MEMORY_FS = frozenset({"tmpfs", "ramfs"})
#: statfs(2) magic numbers, for when /proc/mounts names only a generic type (fuse, fuseblk).
_MAGIC = {0x6969: "nfs", 0x0BD00BD0: "lustre", 0x19830326: "beegfs", 0x47504653: "gpfs",
          0xFF534D42: "cifs", 0xFE534D42: "smb3", 0x00C36400: "ceph", 0x01021994: "tmpfs",
          0xEF53: "ext4", 0x58465342: "xfs", 0x9123683E: "btrfs", 0x794C7630: "overlay",
          0x65735546: "fuse"}
#: Below this much free space a cache folder gets a warning (JAX then writes empty entries).
DEFAULT_MIN_FREE = 1 << 30
#: Whether this call tree only looks (:func:`diagnosis`).
_LOOKING = ContextVar("looking", default=False)


@contextmanager
def diagnosis() -> Iterator[None]:
    """Within it, nothing changes on disk: :func:`check_folder` creates no folder (it says one is
    missing) and writes no probe (it asks ``access(2)``), and the lock probes write nothing
    (``doctor`` without ``--fix``)."""
    token = _LOOKING.set(True)
    try:
        yield
    finally:
        _LOOKING.reset(token)


def may_write(path: Path, trusted_above: Path | None) -> bool:
    """Whether a probe may create or write in ``path``: never during a :func:`diagnosis`, nor
    where ``path`` leads, through a link, out of the cache root ``trusted_above`` (gpu-cache
    writes nothing outside the root)."""
    if _LOOKING.get():
        return False
    if trusted_above is None or path == trusted_above:
        return True
    try:
        safe_io.within(path, trusted_above)
        return True
    except (OSError, ValueError):
        return False


@dataclass(frozen=True)
class FolderCheck:
    """What a probe of one cache folder found. ``problem`` is None when it is usable;
    ``read_only`` when it can be read but not written (hits, no new entries); ``warnings``
    are worth reading but do not stop caching; ``missing``: it does not exist, and a
    :func:`diagnosis` did not create it."""

    path: str
    fs_type: str
    family: str
    network: bool
    free_bytes: int | None
    owner_uid: int | None
    group: str | None
    mode: str | None
    problem: str | None
    read_only: bool = False
    warnings: list[str] = field(default_factory=list)
    missing: bool = False

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _statfs_magic(path: str) -> int | None:
    """The f_type of statfs(2) (os.statvfs does not expose it), or None where unavailable."""
    import ctypes  # deferred: only a FUSE or unknown mount needs it (8 ms of imports)
    import ctypes.util

    class _StatFs(ctypes.Structure):
        _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_byte * 120)]

    libc_name = ctypes.util.find_library("c")
    if not libc_name:
        return None
    libc = ctypes.CDLL(libc_name, use_errno=True)
    buf = _StatFs()
    if libc.statfs(os.fsencode(path), ctypes.byref(buf)) != 0:
        return None
    return buf.f_type & 0xFFFFFFFF


def fs_type(path: Path) -> str:
    """The type of the filesystem that holds ``path`` (its longest mount prefix in
    /proc/mounts, refined by the statfs magic when that says only ``fuse``), or ``unknown``.
    Never raises."""
    try:
        target = os.path.realpath(path)
    except (OSError, ValueError):
        return "unknown"
    best, best_type = "", "unknown"
    try:
        with open("/proc/mounts", errors="surrogateescape") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) < 3:
                    continue
                mount_point = fields[1].replace("\\040", " ")
                inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
                if inside and len(mount_point) >= len(best):
                    best, best_type = mount_point, fields[2]
    except OSError:
        pass
    if best_type in ("unknown", "fuse", "fuseblk"):
        try:
            magic = _statfs_magic(target)
        except (OSError, ValueError):
            magic = None
        if magic is not None and _MAGIC.get(magic, "fuse") != "fuse":
            best_type = _MAGIC[magic]
    return best_type


def family(kind: str) -> str:
    """The family a filesystem type belongs to: a network family (nfs, lustre, beegfs, gpfs,
    ...), ``tmpfs``, ``fuse`` (an unnamed FUSE filesystem: maybe remote), ``local`` or ``unknown``."""
    for name, members in NETWORK_FAMILIES.items():
        if kind in members:
            return name
    if kind in MEMORY_FS:
        return "tmpfs"
    if kind.startswith("fuse"):
        return "fuse"
    return "unknown" if kind == "unknown" else "local"


def require_folder_or_missing(path: Path) -> None:
    """For commands that read an existing cache (prune, stats): a root that does not exist
    is empty, but one that is a file or a broken link is a mistake in the arguments, said in
    the words of :func:`root_check` (doctor's).

    Raises:
        UsageError: ``path`` is a file, a dangling symbolic link or a link loop, or cannot be
            reached.
    """
    try:
        path.stat()
    except FileNotFoundError:
        if not path.is_symlink():
            return
    except OSError:  # ELOOP, ENOTDIR, EACCES
        pass
    else:
        if path.is_dir():
            return
    with diagnosis():
        why = root_check(path).problem or f"{path} is not a folder"
    raise UsageError(f"cache root cannot be used: {why}")


def root_check(root: Path, team: Team | None = None) -> FolderCheck:
    """The check of the cache root itself: whether it can be made (or is there), entered, and
    trusted (``team``: a shared_group's). Its ``problem`` is the one reason every command gives
    for a root that cannot be used (env, doctor, stats, a dry run's warning)."""
    return check_folder(root, team=team, min_free=0, trusted_above=root, probe=False)


def _existing_ancestor(path: Path) -> Path:
    """``path`` or its nearest ancestor that can be looked at (exists, and the path to it can
    be searched); ``/`` at worst. Never raises."""
    current = path
    while current != current.parent:
        try:
            os.stat(current)
            return current
        except (OSError, ValueError):
            current = current.parent
    return current


def is_folder(path: Path) -> bool:
    """Whether ``path`` is a folder (or a link to one). Never raises: on Python 3.11
    ``Path.is_dir()`` raises PermissionError and ENAMETOOLONG."""
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def why_not(exc: OSError) -> str:
    """What an OSError means for a cache path, with what to do about it, in a few words."""
    hints = {
        errno.EACCES: "permission denied: you cannot enter or write a folder on that path; "
                      "choose a cache root you own",
        errno.EPERM: "operation not permitted: choose a cache root you own",
        errno.ENAMETOOLONG: "a name on that path is too long (at most 255 bytes per name); "
                            "choose a shorter cache root",
        errno.ENOTDIR: "a part of that path is a file, not a folder; choose another cache root",
        errno.ELOOP: "too many symbolic links (a link loop) on that path",
        errno.EROFS: "read-only filesystem",
        errno.ENOSPC: "no space left on the device",
    }
    return hints.get(exc.errno or 0, exc.strerror or str(exc))


def _exists(path: Path) -> bool:
    try:
        os.stat(path)
        return True
    except (OSError, ValueError):
        return False


def _uncreatable(path: Path) -> str | None:
    """Why ``path``, which does not exist, could not be created, asked without creating it: the
    nearest folder above it that exists is on a read-only filesystem, not writable for this
    user, or on a filesystem of no size at all (``/proc``, ``/sys``: a cache root there is a
    mistake that a :func:`diagnosis` would otherwise call merely missing). None: it could be."""
    above = _existing_ancestor(path)
    try:
        info = os.statvfs(above)
    except OSError:
        return None
    kind = fs_type(above)
    if info.f_blocks == 0 and family(kind) == "local":
        return (f"cannot create {path}: {above} is on {kind}, a filesystem that holds no files; "
                "choose another cache root")
    code = errno.EROFS if info.f_flag & os.ST_RDONLY else \
        (None if os.access(above, os.W_OK | os.X_OK) else errno.EACCES)
    return f"cannot create {path}: {why_not(OSError(code, os.strerror(code)))}" if code else None


def _probe_write(path: Path) -> tuple[str, int | None] | None:
    """Write a file and atomically rename it, as the caches do; why that failed (and the
    errno), or None."""
    probe = path / f"{names.PROBE_PREFIX}{os.urandom(16).hex()}"
    renamed = probe.with_suffix(".renamed")
    step = "write a file"
    try:
        probe.write_bytes(b"probe")
        step = "rename a file atomically"
        os.replace(probe, renamed)
        step = "delete a file"
        renamed.unlink()
        return None
    except OSError as exc:
        for leftover in (probe, renamed):
            try:
                leftover.unlink()
            except OSError:
                pass
        return f"cannot {step} in {path}: {why_not(exc)}", exc.errno


def _probe_access(path: Path) -> tuple[str, int | None] | None:
    """:func:`_probe_write` asked of ``access(2)``, which writes nothing: it knows the mode, ACLs
    and a read-only mount, not a filesystem whose renames fail."""
    if os.access(path, os.W_OK | os.X_OK):
        return None
    try:
        read_only = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    code = errno.EROFS if read_only else errno.EACCES
    return f"cannot write a file in {path}: {why_not(OSError(code, os.strerror(code)))}", code


def _measured(path: Path, problem: str | None, read_only: bool, missing: bool,
              min_free: int, entries: str) -> FolderCheck:
    """The check of ``path`` (what the probe found) with what the folder, or the nearest one
    above it that exists, is on: its owner, mode, free space, filesystem, and the warnings."""
    where = _existing_ancestor(path)
    try:
        info = where.stat()
        owner, mode, group = info.st_uid, stat.filemode(info.st_mode), trust.group_name(info.st_gid)
    except OSError:
        owner, mode, group = None, None, None
    try:
        free: int | None = shutil.disk_usage(where).free
    except OSError:
        free = None
    kind = fs_type(where)
    fam = family(kind)
    warnings = []
    if read_only:
        warnings.append(f"{path} is read-only: it serves hits but takes no new entries")
    if problem is None and free is not None and free < min_free:
        warnings.append(f"{path} has only {format_size(free)} free (less than {format_size(min_free)}); "
                        f"a full disk leaves empty or truncated {entries} entries (`gpu-cache doctor "
                        "--fix` removes the broken entries it finds)")
    if kind in NETWORK_FS:  # measured on sshfs: a lock through one mount does not stop a second
        may = "" if fam == "sshfs" else "may "  # elsewhere it depends on the filesystem and mount
        warnings.append(f"{path} is on {kind}: file locks there {may}lock only within one machine, "
                        f"so prunes (and JAX's size-cap lock) on two nodes {may or 'do '}not exclude "
                        "each other; prune from one node at a time")
    if fam == "fuse":
        warnings.append(f"{path} is on a FUSE filesystem ({kind}); if it is remote, treat it as a "
                        "network filesystem (node-local cache, compile before fanning out)")
    return FolderCheck(str(path), kind, fam, kind in NETWORK_FS, free, owner, group, mode,
                       problem, read_only, warnings, missing)


def check_folder(path: Path, create: bool = True, team: Team | None = None,
                 min_free: int = DEFAULT_MIN_FREE, trusted_above: Path | None = None,
                 probe: bool = True, private: bool = False, entries: str = "cache") -> FolderCheck:
    """Probe ``path`` as a cache folder: create it (group-shared for a ``team``: the
    shared_group), check that it is trusted (:mod:`gpu_cache.jobenv.trust`), write a file,
    rename it, delete it (unless ``probe`` is False), and measure it. ``private``: folders it
    creates outside shared-group mode get mode 0700. ``entries``: whose entries a full disk
    would break (the kind's name, in the low-space warning). Where it may not write
    (:func:`may_write`: a
    :func:`diagnosis`, or a folder that leads out of ``trusted_above``), it creates and changes
    nothing, says a missing folder is ``missing`` (judging what is there: the folders above it),
    and asks ``access(2)`` instead of writing a probe.

    ``trusted_above``: the folders from there down to ``path`` must all be trusted (the cache
    root and the kind folder); default: only ``path``. Never raises for filesystem trouble
    (permissions, over-long names, a file on the path, link loops, names that are not UTF-8):
    what went wrong is in ``problem``, one sentence a user can act on.
    """
    problem: str | None = None
    read_only = missing = False
    writes = may_write(path, trusted_above)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    except (OSError, ValueError) as exc:
        info = None
        why = why_not(exc) if isinstance(exc, OSError) else str(exc)
        problem = f"cannot {'create' if create else 'use'} {path}: {why}"
    if problem is None:
        is_dir = is_folder(path)
        if info is not None and stat.S_ISLNK(info.st_mode) and not is_dir and \
                not _exists(path):
            problem = f"{path} is a dangling or looping symbolic link"
        elif info is not None and not is_dir:
            problem = f"{path} exists and is not a folder"
        elif create and writes:
            try:
                trust.make_folder(path, team, private)
            except OSError as exc:
                problem = f"cannot create {path}: {why_not(exc)}"
        elif create and info is None:  # what would be made: judge the folders above it
            missing = True
            problem = _uncreatable(path) or trust.distrust(path, team, trusted_above, missing_ok=True)
    is_dir = is_folder(path)
    if problem is None and is_dir and not os.access(path, os.X_OK):
        problem = (f"cannot enter {path}: permission denied (it is not yours to search); "
                   "choose a cache root you own")
    if problem is None and is_dir:
        problem = trust.distrust(path, team, trusted_above)
    if problem is None and is_dir and probe:
        failed = _probe_write(path) if writes else _probe_access(path)
        # A read-only mount or another user's folder can still serve hits.
        if failed and failed[1] in (errno.EROFS, errno.EACCES, errno.EPERM) \
                and os.access(path, os.R_OK | os.X_OK):
            read_only = True
        elif failed:
            problem = failed[0]
    return _measured(path, problem, read_only, missing, min_free, entries)


def node_local_fallback(kind: str) -> Path:
    """A per-user folder on local disk for a kind whose shared folder cannot be used:
    ``$TMPDIR/gpu-cache-<uid>/<kind>``."""
    return Path(tempfile.gettempdir()) / names.node_local_name(os.getuid()) / kind
