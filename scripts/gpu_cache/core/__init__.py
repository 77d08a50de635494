"""The job side: the code that runs inside job images and environments.

The workload runner (``python -m gpu_cache.core.runner``), the cache kinds and their
inventories, the safe-I/O layer (``safe_io``: files and folders; ``safe_locks``: locks) and
the report types. Jobs run it with whatever Python their
image has, so it needs only the standard library, on Python 3.9 or later, and imports nothing
of gpu_cache outside ``core`` (both enforced: ruff's per-file target version and
tests/test_layers.py).
"""

from pathlib import Path

#: The folder that holds the gpu_cache package: put on jobs' PYTHONPATH, bound into containers.
PACKAGE_PARENT = Path(__file__).resolve().parents[2]
#: The startup hook's folder, first on jobs' PYTHONPATH.
HOOK_DIR = PACKAGE_PARENT / "gpu_cache" / "_hook"
