"""The job environment's contract: every variable name gpu-cache exports or reads, the names
and prefixes of the files it leaves in cache folders, and its mode words, in one place.

The host side (config, jobenv, commands) and the job side (core, the workload runner, the
built-in workloads) import these names and write none of them themselves. The names the
startup hook uses live in the hook's leaf, ``_hook/gpu_cache_hook/names.py`` (the hook cannot
import this package), and are imported from there: one home each.

Standard library only, Python 3.9+ (the job side imports it).
"""

from typing import Literal

from gpu_cache._hook.gpu_cache_hook.names import (  # noqa: F401 (the hook's names, this module's to its users)
    AUTOTUNE_SAVE_VAR,
    AUTOTUNE_VAR,
    BYTECODE_VAR,
    CLUSTER,
    CUDA_CACHE_PATH_VAR,
    GPU_TYPE_VAR,
    IMAGE_VARIABLES,
    INDUCTOR_CACHE_DIR_VAR,
    JAX_CACHE_DIR_VAR,
    JAX_TRITON_VAR,
    LOCK_MODE_VAR,
    LOCK_TIMEOUT_VAR,
    LOCKS_VAR,
    NODE,
    NODE_LOCAL_PREFIX,
    PTXAS_KERNELS_VAR,
    PTXAS_NESTED_VAR,
    PTXAS_PYTHON_VAR,
    PTXAS_REAL_VAR,
    PTXAS_TALLY_VAR,
    PTXAS_VAR,
    RECORDS_VAR,
    RULE_VAR,
    RUN_ID_VAR,
    SET_ASIDE_PREFIX,
    SET_ASIDE_SEEN,
    SHARED_VAR,
    STATE_FOLDER,
    TEMP_PREFIX,
    TIER_MAX_BYTES_VAR,
    TIER_TEST_PAUSE_VAR,
    TIER_VAR,
    TOKAMAX_FIX_VAR,
    TORCH_EXTENSIONS_DIR_VAR,
    TRIM_LOCK,
    TRIM_STAMP,
    TRITON_CACHE_DIR_VAR,
    TRITON_MANAGER_VAR,
    TRITON_SEED_VAR,
    TRITON_TORCH_VAR,
    WILDCARDS_VAR,
    XLA_AUTOTUNE_CACHE,
)

# --- gpu-cache's own variables ------------------------------------------------------------

#: The cache root (``none``, ``off``, ... turns caching off); ``gpu-cache env`` exports it.
ROOT_VAR = "GPU_CACHE_ROOT"
#: The names gpu-cache set earlier in this process tree (comma-separated): its own, not the user's.
MANAGED_VAR = "GPU_CACHE_MANAGED"
#: ``1`` once the exports' warnings were printed in this process tree.
WARNED_VAR = "GPU_CACHE_WARNED"
#: The OCI registry's login (issue 32); they win over docker's config.json.
REGISTRY_USERNAME_VAR = "GPU_CACHE_REGISTRY_USERNAME"
REGISTRY_PASSWORD_VAR = "GPU_CACHE_REGISTRY_PASSWORD"
#: Seconds a registry may take to connect or stay silent (default 5); each exchange's deadline grows with it.
REGISTRY_TIMEOUT_VAR = "GPU_CACHE_REGISTRY_TIMEOUT"
#: The Triton targets (``cuda:90,...``) the built-in Triton workload compiles for ahead of time.
TRITON_TARGETS_VAR = "GPU_CACHE_TRITON_TARGETS"
#: The file a built-in workload writes its outputs to, for validation's proof (issue 40).
OUTPUTS_VAR = "GPU_CACHE_OUTPUTS"

# --- the tools' variables that gpu-cache sets -----------------------------------------------

#: JAX's real off switch (an empty cache folder does not switch it off).
JAX_ENABLE_CACHE_VAR = "JAX_ENABLE_COMPILATION_CACHE"
JAX_MIN_COMPILE_TIME_VAR = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
JAX_MIN_ENTRY_SIZE_VAR = "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"
JAX_XLA_CACHES_VAR = "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"
TRITON_HOME_VAR = "TRITON_HOME"
TRITON_AUTOTUNING_VAR = "TRITON_CACHE_AUTOTUNING"
VLLM_CACHE_ROOT_VAR = "VLLM_CACHE_ROOT"
#: Numba's on-disk cache folder (``@jit(cache=True)``).
NUMBA_CACHE_DIR_VAR = "NUMBA_CACHE_DIR"
#: Set for the workloads: several JAX processes may share one GPU.
XLA_PREALLOCATE_VAR = "XLA_PYTHON_CLIENT_PREALLOCATE"
#: Bind lists of container runtimes, which gpu-cache extends (never owns).
CONTAINER_BIND_VARS = ("APPTAINER_BIND", "SINGULARITY_BIND")

# --- mode words -----------------------------------------------------------------------------

#: Single-flight's lock modes (NODE, CLUSTER): ``flock`` alone, or ``flock`` within a node and
#: a lease per key across the nodes that share the lock folder.
LockMode = Literal["node", "cluster"]
#: ``local_tier.mode``: on where the cache root is on a network filesystem, always, never.
TierMode = Literal["auto", "on", "off"]
#: The rule (RULE_VAR) each pass of gpu-cache's own names its records with: ``<phase>_cache``.
OWN_RULES = ("warm_cache", "validate_cache")
#: The value of ``GPU_CACHE_ROOT`` that ``gpu-cache env`` exports with caching off.
ROOT_OFF = "none"
#: Triton's cache manager (in the hook's folder) over a read-only seed cache.
SEED_MANAGER = "gpu_cache_hook.kinds.triton.seed:SeedOverlayCacheManager"

# --- file names -----------------------------------------------------------------------------

#: The node-local tier's folder in the per-user node-local folder (``/tmp/gpu-cache-<uid>/tier``
#: by default).
TIER_FOLDER = "tier"
#: Single-flight's lock folder under the cache root (not a cache kind).
LOCKS_FOLDER = "locks"
#: The probe files gpu-cache env writes and removes in a folder it checks (writes, flock, leases).
PROBE_PREFIX = ".gpu-cache-probe-"


def node_local_name(uid: int) -> str:
    """The name of user ``uid``'s node-local folder: ``gpu-cache-<uid>``."""
    return f"{NODE_LOCAL_PREFIX}{uid}"


def own_rule(phase: str) -> str:
    """The rule name a pass of gpu-cache's own (``warm``, ``validate``, ``cold``) records."""
    return f"{phase}_cache"
