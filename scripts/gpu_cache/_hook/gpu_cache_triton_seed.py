"""A Triton cache manager that reads a read-only seed cache and writes elsewhere.

Triton raises on a miss when its cache folder cannot be written. gpu-cache points
``TRITON_CACHE_DIR`` at a node-local folder, ``GPU_CACHE_TRITON_SEED`` at the read-only
shared cache and ``TRITON_CACHE_MANAGER=gpu_cache_triton_seed:SeedOverlayCacheManager``
(this module is on the jobs' ``PYTHONPATH``): hits come from the seed when it has them, new
kernels go to the node-local folder, and nothing ever writes to the seed.
"""

from __future__ import annotations

import json
import os

from triton.runtime.cache import FileCacheManager

SEED_VAR = "GPU_CACHE_TRITON_SEED"


class SeedOverlayCacheManager(FileCacheManager):
    """Triton's file cache manager over ``$TRITON_CACHE_DIR``, with ``$GPU_CACHE_TRITON_SEED``
    consulted first for reads."""

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        super().__init__(key, override, dump)
        seed = os.environ.get(SEED_VAR)
        self.seed_dir = os.path.join(seed, key) if seed and not (override or dump) else None

    def get_file(self, filename: str) -> str | None:
        if self.seed_dir:
            path = os.path.join(self.seed_dir, filename)
            if os.path.exists(path):
                return path
        return super().get_file(filename)

    def get_group(self, filename: str) -> dict[str, str] | None:
        # Same rules as FileCacheManager.get_group: a group counts only when every child exists.
        if self.seed_dir:
            try:
                with open(os.path.join(self.seed_dir, f"__grp__{filename}")) as stream:
                    children = json.load(stream).get("child_paths")
            except (OSError, ValueError, AttributeError):
                children = None
            if isinstance(children, dict) and all(os.path.exists(p) for p in children.values()):
                return dict(children)
        return super().get_group(filename)
