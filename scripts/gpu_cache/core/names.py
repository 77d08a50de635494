"""The job environment's contract: every variable name gpu-cache exports or reads, the names
and prefixes of the files it leaves in cache folders, and its mode words, in one place.

The host side (config, jobenv, commands) and the job side (core, the workload runner, the
built-in workloads) import these names and write none of them themselves. The startup hook
cannot import this module (it runs in images without the package, and must load nothing
more in every process): ``_hook/sitecustomize.py`` keeps the one copy of the names the hook
uses, and tests/test_names.py fails when a name there differs from its value here.

Standard library only, Python 3.9+ (the job side imports it).
"""

from typing import Literal

# --- gpu-cache's own variables ------------------------------------------------------------

#: The cache root (``none``, ``off``, ... turns caching off); ``gpu-cache env`` exports it.
ROOT_VAR = "GPU_CACHE_ROOT"
#: The folder of the startup hook's per-process records (unset, empty or relative: none).
RECORDS_VAR = "GPU_CACHE_RECORDS"
#: The names gpu-cache set earlier in this process tree (comma-separated): its own, not the user's.
MANAGED_VAR = "GPU_CACHE_MANAGED"
#: ``1`` once the exports' warnings were printed in this process tree.
WARNED_VAR = "GPU_CACHE_WARNED"
#: Single-flight: the lock folder (empty: off), how long a waiter waits (seconds), its mode.
LOCKS_VAR = "GPU_CACHE_LOCKS"
LOCK_TIMEOUT_VAR = "GPU_CACHE_LOCK_TIMEOUT"
LOCK_MODE_VAR = "GPU_CACHE_LOCK_MODE"
#: The node-local tier (issue 23): this root's local folder (empty: no tier in this process),
#: the cache root behind it, and the local tier's bound in bytes.
TIER_VAR = "GPU_CACHE_TIER"
SHARED_VAR = "GPU_CACHE_SHARED"
TIER_MAX_BYTES_VAR = "GPU_CACHE_TIER_MAX_BYTES"
#: Tests only: an absolute path a promotion creates, then sleeps, before it links its entry.
TIER_TEST_PAUSE_VAR = "GPU_CACHE_TIER_TEST_PAUSE"
#: A read-only root's Triton cache, read under the node-local one (the seed manager).
TRITON_SEED_VAR = "GPU_CACHE_TRITON_SEED"
#: The bytecode cache's folder (``bytecode_cache: true``).
BYTECODE_VAR = "GPU_CACHE_BYTECODE"
#: tokamax's autotuning results (issue 24), and ``1``: a warm process saves what it autotunes.
AUTOTUNE_VAR = "GPU_CACHE_AUTOTUNE"
AUTOTUNE_SAVE_VAR = "GPU_CACHE_AUTOTUNE_SAVE"
#: jax-triton's kernel cache (issue 34), and the ptxas shim's (its results for jaxlib).
JAX_TRITON_VAR = "GPU_CACHE_JAX_TRITON"
PTXAS_VAR = "GPU_CACHE_PTXAS"
#: The ptxas shim's own (the hook sets them for it): the real ptxas, the Python the shim runs
#: with, its tally of calls (read into the record), the mark of a call from the real ptxas, and
#: ``<pid>:<folder>``, the kernels jaxlib's Triton path made in process <pid> (issue 37).
PTXAS_REAL_VAR = "GPU_CACHE_PTXAS_REAL"
PTXAS_PYTHON_VAR = "GPU_CACHE_PTXAS_PYTHON"
PTXAS_TALLY_VAR = "GPU_CACHE_PTXAS_TALLY"
PTXAS_NESTED_VAR = "GPU_CACHE_PTXAS_NESTED"
PTXAS_KERNELS_VAR = "GPU_CACHE_PTXAS_KERNELS"
#: ``1``: Triton may import torch for its specialisation (the hook spares it otherwise).
TRITON_TORCH_VAR = "GPU_CACHE_TRITON_TORCH"
#: ``0``, ``off``, ``false`` or ``no`` switches the hook's tokamax fix off (issue 20).
TOKAMAX_FIX_VAR = "GPU_CACHE_TOKAMAX_FIX"
#: What a record names the job by: its rule, wildcards, GPU type, and the pass's run id.
RULE_VAR = "GPU_CACHE_RULE"
WILDCARDS_VAR = "GPU_CACHE_WILDCARDS"
GPU_TYPE_VAR = "GPU_CACHE_GPU_TYPE"
RUN_ID_VAR = "GPU_CACHE_RUN_ID"
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

JAX_CACHE_DIR_VAR = "JAX_COMPILATION_CACHE_DIR"
#: JAX's real off switch (an empty cache folder does not switch it off).
JAX_ENABLE_CACHE_VAR = "JAX_ENABLE_COMPILATION_CACHE"
JAX_MIN_COMPILE_TIME_VAR = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
JAX_MIN_ENTRY_SIZE_VAR = "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"
JAX_XLA_CACHES_VAR = "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"
TRITON_CACHE_DIR_VAR = "TRITON_CACHE_DIR"
TRITON_HOME_VAR = "TRITON_HOME"
TRITON_AUTOTUNING_VAR = "TRITON_CACHE_AUTOTUNING"
TRITON_MANAGER_VAR = "TRITON_CACHE_MANAGER"
INDUCTOR_CACHE_DIR_VAR = "TORCHINDUCTOR_CACHE_DIR"
VLLM_CACHE_ROOT_VAR = "VLLM_CACHE_ROOT"
TORCH_EXTENSIONS_DIR_VAR = "TORCH_EXTENSIONS_DIR"
CUDA_CACHE_PATH_VAR = "CUDA_CACHE_PATH"
CUDA_CACHE_DISABLE_VAR = "CUDA_CACHE_DISABLE"
#: Set for the workloads: several JAX processes may share one GPU.
XLA_PREALLOCATE_VAR = "XLA_PYTHON_CLIENT_PREALLOCATE"
#: Bind lists of container runtimes, which gpu-cache extends (never owns).
CONTAINER_BIND_VARS = ("APPTAINER_BIND", "SINGULARITY_BIND")

# --- mode words -----------------------------------------------------------------------------

#: Single-flight's lock modes: ``flock`` alone, or ``flock`` within a node and a lease per key
#: across the nodes that share the lock folder.
LockMode = Literal["node", "cluster"]
NODE: LockMode = "node"
CLUSTER: LockMode = "cluster"
#: ``local_tier.mode``: on where the cache root is on a network filesystem, always, never.
TierMode = Literal["auto", "on", "off"]
TIER_MODES = ("auto", "on", "off")
#: The rule (RULE_VAR) each pass of gpu-cache's own names its records with: ``<phase>_cache``.
OWN_RULES = ("warm_cache", "validate_cache")
#: The value of ``GPU_CACHE_ROOT`` that ``gpu-cache env`` exports with caching off.
ROOT_OFF = "none"
#: XLA's per-fusion autotune results, the value of JAX_XLA_CACHES_VAR that keeps only them.
XLA_AUTOTUNE_CACHE = "xla_gpu_per_fusion_autotune_cache_dir"
#: Triton's cache manager (in the hook's folder) over a read-only seed cache.
SEED_MANAGER = "gpu_cache_hook.kinds.triton.seed:SeedOverlayCacheManager"

# --- file names -----------------------------------------------------------------------------

#: The per-user folder of node-local fallbacks and tiers: ``<tmp>/gpu-cache-<uid>``.
NODE_LOCAL_PREFIX = "gpu-cache-"
#: The node-local tier's folder in it (``/tmp/gpu-cache-<uid>/tier`` by default).
TIER_FOLDER = "tier"
#: Single-flight's lock folder under the cache root (not a cache kind).
LOCKS_FOLDER = "locks"
#: Small state files under the cache root (measurements, verdicts; not a cache kind).
STATE_FOLDER = "state"
#: A copy or promotion's temporary file: ``.gpu-cache-tmp.<host>.<pid>.<random>``.
TEMP_PREFIX = ".gpu-cache-tmp."
#: The probe files gpu-cache env writes and removes in a folder it checks (writes, flock, leases).
PROBE_PREFIX = ".gpu-cache-probe-"
#: The local tier's trim stamp, and the lock that lets one process trim at a time.
TRIM_STAMP = ".gpu-cache-trim"
TRIM_LOCK = ".gpu-cache-trim.lock"
#: The entries of a tiered kind that validation set aside (issue 40), which every node's
#: local tier drops: ``<root>/<STATE_FOLDER>/set-aside-<kind>.json``.
SET_ASIDE_PREFIX = "set-aside-"
#: A local tier's mark of the set-aside list it applied: ``.gpu-cache-set-aside.<kind>.<state>``.
SET_ASIDE_SEEN = ".gpu-cache-set-aside."


def node_local_name(uid: int) -> str:
    """The name of user ``uid``'s node-local folder: ``gpu-cache-<uid>``."""
    return f"{NODE_LOCAL_PREFIX}{uid}"


def own_rule(phase: str) -> str:
    """The rule name a pass of gpu-cache's own (``warm``, ``validate``, ``cold``) records."""
    return f"{phase}_cache"
