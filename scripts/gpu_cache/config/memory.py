"""Peak host memory of one run of a built-in workload at a shape (issue 49): what a warm or
check job needs for each run it makes at once (:mod:`gpu_cache.config.placement` sizes the jobs
from it, and the workload runner starts runs side by side only while they fit the job).

Measured with tests/benchmarks/alphafold3_memory.py: one process of AlphaFold 3's real network
per token bucket (ColabFold's wheel of its model code, random weights of the real shapes).
"""

from __future__ import annotations

import math
from typing import Any

#: AlphaFold 3 at N tokens: ``AF3_BASE_MB + AF3_PER_TOKEN_SQ_MB x N^2``, times ``SAFETY``.
#: The base is the process before its first call (Python, jax, the network's parameters, XLA's
#: compile: flat in N, 2.7 GB on the CPU for 128 to 1024 tokens); the N^2 part is what the call
#: adds on the CPU, where the pair activations are host memory (on a GPU they are the device's).
AF3_BASE_MB = 2750
AF3_PER_TOKEN_SQ_MB = 0.0
#: Room over the measured peak (another jax, another image, a GPU runtime's libraries).
SAFETY = 1.5


def run_memory_mb(workload: str, builtin: bool, shape: Any) -> int | None:
    """The host memory (MB) one run of ``workload`` at ``shape`` needs, where it is known (None:
    a user's workload, or a built-in whose size was not measured)."""
    if builtin and workload == "alphafold3" and str(shape).isdigit():
        return math.ceil(SAFETY * (AF3_BASE_MB + AF3_PER_TOKEN_SQ_MB * int(shape) ** 2))
    return None
