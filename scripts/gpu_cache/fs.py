"""Filesystem facts about a cache folder: can it be used, and what is it on."""

from __future__ import annotations

import os
import shutil
import stat
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

#: Filesystem types (as /proc/mounts names them) that are shared over the network.
NETWORK_FS = frozenset({"nfs", "nfs4", "lustre", "beegfs", "gpfs", "cifs", "smb3", "fuse.sshfs",
                        "ceph", "fuse.ceph", "glusterfs", "fuse.glusterfs", "panfs", "wekafs"})


@dataclass(frozen=True)
class FolderCheck:
    """What a probe of one cache folder found. ``problem`` is None when it is usable."""

    path: str
    fs_type: str
    network: bool
    free_bytes: int | None
    owner_uid: int | None
    mode: str | None
    problem: str | None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def fs_type(path: Path) -> str:
    """The type of the filesystem that holds ``path`` (its longest mount prefix), or ``unknown``."""
    target = os.path.realpath(path)
    best, best_type = "", "unknown"
    try:
        with open("/proc/mounts") as mounts:
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
    return best_type


def _existing_ancestor(path: Path) -> Path:
    current = path
    while not current.exists() and current != current.parent:
        current = current.parent
    return current


def check_folder(path: Path, create: bool = True) -> FolderCheck:
    """Probe ``path`` as a cache folder: create it, write a file, rename it, delete it.

    Never raises for filesystem trouble: what went wrong is in ``problem``, in words a
    user can act on.
    """
    problem: str | None = None
    try:
        if path.is_symlink() and not path.exists():
            problem = f"{path} is a dangling or looping symbolic link"
        elif path.exists() and not path.is_dir():
            problem = f"{path} exists and is not a folder"
        elif create:
            path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        problem = f"cannot create {path}: {exc.strerror or exc}"
    if problem is None and path.is_dir():
        probe = path / f".gpu-cache-probe-{uuid.uuid4().hex}"
        try:
            probe.write_bytes(b"probe")
            os.replace(probe, probe.with_suffix(".renamed"))
            probe.with_suffix(".renamed").unlink()
        except OSError as exc:
            problem = f"cannot write in {path}: {exc.strerror or exc}"
            for leftover in (probe, probe.with_suffix(".renamed")):
                try:
                    leftover.unlink()
                except OSError:
                    pass
    where = path if path.exists() else _existing_ancestor(path)
    try:
        info = where.stat()
        owner, mode = info.st_uid, stat.filemode(info.st_mode)
    except OSError:
        owner, mode = None, None
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        free = None
    kind = fs_type(where)
    return FolderCheck(str(path), kind, kind in NETWORK_FS, free, owner, mode, problem)
