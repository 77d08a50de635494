"""The node-local tier on one machine, for the tier's job-side tests (test_tier_hook, and the
Inductor ones): each "node" a mount namespace of its own whose folder is bound at the one fixed
local-tier path, as on a cluster, where every node has its own disk there."""

from __future__ import annotations

import subprocess
from pathlib import Path

from helpers import HOOK, SCRIPTS, clean_environ


def node_env(root: Path, local: Path, records: Path, **extra: str) -> dict[str, str]:
    """What gpu-cache exports with the tier on (set by hand here)."""
    return clean_environ(**{
        "PYTHONPATH": f"{HOOK}:{SCRIPTS}", "GPU_CACHE_RECORDS": str(records),
        "JAX_COMPILATION_CACHE_DIR": str(local / "jax"), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "TRITON_CACHE_DIR": str(local / "triton"), "TRITON_DEFAULT_FP_FUSION": "1",
        "GPU_CACHE_TIER": str(local), "GPU_CACHE_SHARED": str(root),
        "GPU_CACHE_TIER_MAX_BYTES": str(1 << 30), **extra})


def on_node(node: Path, local: Path, command: list[str], environ: dict[str, str],
            **popen) -> subprocess.Popen[str]:
    """``command`` on a node: its own mount namespace, ``node`` bound at ``local``."""
    node.mkdir(exist_ok=True)
    script = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
    return subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh",
                             str(node), str(local), *command], env=environ, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)
