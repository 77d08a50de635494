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

import json
import os

from gpu_cache_hook import tier as node_tier
from gpu_cache_hook.kinds.triton.seed import SINGLE_FILES, FlightCacheManager

#: Files Triton writes and reads alone, without a group (``get_file``): promoted as soon as they
#: are written, before single-flight releases them. Every other file is a group's child and is
#: promoted with its group.
ALONE = SINGLE_FILES
GROUP_PREFIX = "__grp__"


class TierCacheManager(FlightCacheManager):
    """Triton's file cache manager over the local tier, fed from and promoted to the shared one."""

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        super().__init__(key, override, dump)
        tier = node_tier.get()
        local = os.path.dirname(os.path.normpath(self.cache_dir or ""))
        usable = tier is not None and tier.enabled("triton") and not (override or dump)
        self._tier = tier if usable and local == tier.local_folder("triton") else None

    def _where(self) -> str:
        if self._tier is not None:
            return self._tier.shared_folder("triton")
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
        if self._tier is not None and self._tier.fetch_group(self.key, GROUP_PREFIX + filename,
                                                             self.cache_dir):
            return super()._lookup(filename)
        return None

    def _lookup_file(self, filename: str) -> str | None:
        found = super()._lookup_file(filename)
        if found is None and self._tier is not None and self._tier.fetch_key_file(self.key, filename):
            found = super()._lookup_file(filename)
        return found

    def _stored(self, data, filename: str) -> None:
        if self._tier is None:
            return
        if filename.startswith(GROUP_PREFIX):
            self._promote_group(data, filename)
        elif filename.endswith(ALONE):
            self._tier.promote_key_files(self.key, [filename])

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
            self._tier.counts("triton")["promote_failed"] += 1
            self._tier.failed("triton", exc)
            return
        shared = os.path.join(self._tier.shared_folder("triton"), self.key)
        self._tier.promote_key_files(self.key, names, group_name=filename, shared_dir=shared)
