"""gpu-cache: warm, validate, prune and observe the JIT compile caches of GPU jobs.

The public entry points are the CLI (``gpu-cache`` / ``python -m gpu_cache``) and the
modules it is built from: :mod:`gpu_cache.settings` (config and cache root),
:mod:`gpu_cache.env` (the exported environment), :mod:`gpu_cache.warm`,
:mod:`gpu_cache.validate`, :mod:`gpu_cache.prune` and :mod:`gpu_cache.stats`.
"""

__version__ = "0.1.0"
