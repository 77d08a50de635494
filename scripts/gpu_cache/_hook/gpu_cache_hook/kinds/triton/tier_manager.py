"""gpu-cache's Triton cache manager for the node-local tier (issue 23; ``tier``).

``TierCacheManager`` is the single-flight manager (``kinds.triton.seed.FlightCacheManager``)
over the local tier's ``$TRITON_CACHE_DIR``, with the shared tier behind it: a group missing
locally is copied in from the shared tier (its children, then its group file, naming the local
copies), as is a file Triton reads alone (``get_file``: a launcher ``.so``, an
``*.autotune.json``), on the first look and at each of single-flight's peeks; a group this
process writes is promoted (its children, then its group file, naming the shared copies), and a
file Triton writes alone right after it is written, both before single-flight releases them.
Single-flight names its locks after the shared folder, so processes on every node agree. The
startup hook makes it Triton's manager (``triton.knobs.cache.manager_class``) when the tier is
on and you named no manager of your own.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time

from ... import tier as node_tier
from ...tier import files
from .seed import SINGLE_FILES, FlightCacheManager

#: Files Triton writes and reads alone, without a group (``get_file``): promoted as soon as they
#: are written, before single-flight releases them. Every other file is a group's child and is
#: promoted with its group.
ALONE = SINGLE_FILES
GROUP_PREFIX = "__grp__"
#: The kind whose key folders this module moves between the tiers.
KIND = "triton"


class TierCacheManager(FlightCacheManager):
    """Triton's file cache manager over the local tier, fed from and promoted to the shared one."""

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        super().__init__(key, override, dump)
        tier = node_tier.get()
        local = os.path.dirname(os.path.normpath(self.cache_dir or ""))
        usable = tier is not None and tier.enabled(KIND) and not (override or dump)
        self._tier = tier if usable and local == tier.local_folder(KIND) else None

    def _where(self) -> str:
        if self._tier is not None:
            return self._tier.shared_folder(KIND)
        return super()._where()

    def _lookup(self, filename: str) -> dict[str, str] | None:
        group = super()._lookup(filename)
        if group is not None:
            if self._tier is not None:
                try:
                    os.utime(self.cache_dir)  # used now: the bound trims least recently used first
                except OSError:
                    pass
            return group
        if self._tier is not None and fetch_group(self._tier, self.key, GROUP_PREFIX + filename,
                                                        self.cache_dir):
            return super()._lookup(filename)
        return None

    def _lookup_file(self, filename: str) -> str | None:
        found = super()._lookup_file(filename)
        if found is None and self._tier is not None and fetch_key_file(self._tier, self.key, filename):
            found = super()._lookup_file(filename)
        return found

    def _stored(self, data, filename: str) -> None:
        if self._tier is None:
            return
        if filename.startswith(GROUP_PREFIX):
            self._promote_group(data, filename)
        elif filename.endswith(ALONE):
            promote_key_files(self._tier, self.key, [filename])

    def _promote_group(self, data, filename: str) -> None:
        """Promote a group just written (``put_group`` calls ``put`` for its group file, before
        single-flight releases the key): its children in this key folder, then the group."""
        try:
            children = json.loads(data).get("child_paths")
            names = [os.path.basename(p) for p in children.values()
                     if os.path.dirname(os.path.normpath(p)) == os.path.normpath(self.cache_dir)]
            if len(names) != len(children):
                raise ValueError("a group whose children are not in its key folder")
        except Exception as exc:  # never into the job: the group stays local
            self._tier.counts(KIND)["promote_failed"] += 1
            self._tier.failed(KIND, exc)
            return
        shared = os.path.join(self._tier.shared_folder(KIND), self.key)
        promote_key_files(self._tier, self.key, names, group_name=filename, shared_dir=shared)


# --- the tier's moves of Triton's key folders (a group file and its children) -------------

def fetch_group(tier, key, group_name, local_dir):
    """Copy the shared Triton group ``<key>/<group_name>`` (its children, then its group
    file, with the child paths made local) into the local tier. Whether it is there now.
    Never raises."""
    return _fetch_key(tier, key, group_name=group_name, local_dir=local_dir)


def fetch_key_file(tier, key, name):
    """Copy one shared file ``<key>/<name>`` of Triton's (a launcher ``.so``, an
    ``*.autotune.json``) into the local tier. Whether it is there now. Never raises."""
    return _fetch_key(tier, key, names=(name,))


def _fetch_key(tier, key, names=(), group_name=None, local_dir=None):
    """Copy the shared Triton files ``<key>/<names>`` (with ``group_name``: the group's
    children) missing locally, then the group file with its child paths made local ones.
    Whether they are all there now. Never raises."""
    plain = all(files.plain(n) for n in names) and (group_name is None or files.plain(group_name))
    if not tier.enabled(KIND) or not files.plain(key) or not plain:
        return False
    started = time.monotonic()
    src = dst = None
    try:
        src = tier.shared.sub(KIND, key, make=False)
        if group_name is not None:
            names = group_children(src, group_name)
            if names is None:
                return False
        dst = tier.local.sub(KIND, key, make=True)
        size = 0
        for name in names:
            try:
                os.stat(name, dir_fd=dst, follow_symlinks=False)
                continue
            except FileNotFoundError:
                pass
            placed = tier.place(src, name, tier.local.folder(KIND), dst, name,
                                fetched=(KIND, f"{key}/{name}"))
            if not placed and not files.exists_at(dst, name):
                return False
            size += placed
        if group_name is not None:
            size += tier.place(src, group_name, tier.local.folder(KIND), dst, group_name,
                               rewrite=lambda data: rewrite_group(data, local_dir),
                               fetched=(KIND, f"{key}/{group_name}"))
    except FileNotFoundError:
        return False
    except Exception as exc:  # never into the job: the entry stays where it is
        tier.refused(KIND, exc, fetching=True)
        return False
    finally:
        for fd in (src, dst):
            if fd is not None:
                os.close(fd)
    tier.fetched(KIND, size, started)
    return True


def promote_key_files(tier, key, names, group_name=None, shared_dir=None):
    """Promote the local Triton files ``<key>/<names>``, then (``group_name``) the group
    file with its child paths made shared ones, only when every child is in the shared tier.
    Never raises."""
    if not tier.promoting(KIND) or not files.plain(key) or not all(files.plain(n) for n in names):
        tier.counts(KIND)["promote_failed"] += 1
        return False
    started = time.monotonic()
    src = dst = None
    size = 0
    try:
        shared = tier.shared.folder(KIND)
        src = tier.local.sub(KIND, key, make=False)
        dst = tier.shared.sub(KIND, key, make=True)
        for name in names:
            placed = tier.place(src, name, shared, dst, name, pause=True)
            if not placed and not files.exists_at(dst, name):
                raise OSError(errno.ENOENT, f"{key}/{name} could not be promoted")
            size += placed
        if group_name is not None and files.plain(group_name):
            size += tier.place(src, group_name, shared, dst, group_name, pause=True,
                               rewrite=lambda data: rewrite_group(data, shared_dir))
    except Exception as exc:  # never into the job: the entry stays where it is
        tier.refused(KIND, exc)
        tier.counts(KIND)["promote_failed"] += 1
        return False
    finally:
        for fd in (src, dst):
            if fd is not None:
                os.close(fd)
    tier.promoted(KIND, size, started)
    return True


def group_children(folder_fd, group_name):
    """The child file names a Triton group file lists (each must be a plain name), or None."""
    try:
        fd = os.open(group_name, files.READ, dir_fd=folder_fd)
    except FileNotFoundError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        children = json.loads(files.read_all(fd, info.st_size)).get("child_paths")
    except (ValueError, AttributeError):
        return None
    finally:
        os.close(fd)
    if not isinstance(children, dict) or not all(isinstance(p, str) for p in children.values()):
        return None
    names = [os.path.basename(p) for p in children.values()]
    return names if all(files.plain(n) for n in names) else None


def rewrite_group(data, folder):
    """A Triton group file's content with each child path moved into ``folder`` (Triton lists
    children by absolute path: a group copied elsewhere must name the copies)."""
    try:
        children = json.loads(data).get("child_paths")
    except (ValueError, AttributeError):
        return None
    if not isinstance(children, dict) or not all(isinstance(p, str) for p in children.values()):
        return None
    moved = {c: os.path.join(folder, os.path.basename(p)) for c, p in children.items()}
    return json.dumps({"child_paths": moved}).encode()
