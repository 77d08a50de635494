"""Peak host memory of one run of a built-in workload at a shape (issue 49): what a warm or
check job needs for each run it makes at once (:mod:`gpu_cache.config.placement` sizes the jobs
from it, and the workload runner starts runs side by side only while they fit the job).

AlphaFold 3, measured with tests/benchmarks/alphafold3_memory.py on the 2-core CPU machine
(ColabFold's wheel of its model code, random weights of the real shapes, JAX on the CPU; results
in tests/benchmarks/results/cpu_alphafold3_memory*.json):

- a process up to its compile (Python, jax, the network's parameters, XLA's compile) peaks at
  2705-2797 MB for 128 to 1024 tokens: flat in N;
- a call adds what its activations take on the CPU: 3614 MB peak at 128 tokens, 4614 MB at 256
  (1 recycle, 1 diffusion sample, 2 steps): about 6.9 MB a token (the MSA stack, always padded
  to 16384 rows) and 0.0013 MB a token squared (the pair stack).

On a GPU the activations are the device's, so these bound the host's part from above, but for
the GPU runtime's own libraries; tests/benchmarks/alphafold3_memory.py gives the H200's figures.
"""

from __future__ import annotations

import math
from typing import Any

#: AlphaFold 3 at N tokens: ``AF3_BASE_MB + AF3_PER_TOKEN_MB x N + AF3_PER_TOKEN_SQ_MB x N^2``,
#: the fit of the figures above, times ``SAFETY``.
AF3_BASE_MB = 2750
AF3_PER_TOKEN_MB = 6.9
AF3_PER_TOKEN_SQ_MB = 0.0013
#: Room over the measured peak, as AlphaPulldownSnakemake leaves over its own (1.25).
SAFETY = 1.25


def run_memory_mb(workload: str, builtin: bool, shape: Any) -> int | None:
    """The host memory (MB) one run of ``workload`` at ``shape`` needs, where it is known (None:
    a user's workload, or a built-in whose size was not measured)."""
    if builtin and workload == "alphafold3" and str(shape).isdigit():
        tokens = int(shape)
        return math.ceil(SAFETY * (AF3_BASE_MB + AF3_PER_TOKEN_MB * tokens + AF3_PER_TOKEN_SQ_MB * tokens**2))
    return None
