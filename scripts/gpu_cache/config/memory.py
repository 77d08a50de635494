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
import re
from typing import Any

#: AlphaFold 3 at N tokens: ``AF3_BASE_MB + AF3_PER_TOKEN_MB x N + AF3_PER_TOKEN_SQ_MB x N^2``,
#: the fit of the figures above, times ``SAFETY``.
AF3_BASE_MB = 2750
AF3_PER_TOKEN_MB = 6.9
AF3_PER_TOKEN_SQ_MB = 0.0013
#: Room over the measured peak, as AlphaPulldownSnakemake leaves over its own (1.25).
SAFETY = 1.25
#: The largest AlphaFold 3 bucket gpu-cache sizes (AlphaFold 3's and AlphaPulldown's largest
#: default is 5120): at 100000 tokens one run would need about 16 TB.
MAX_TOKENS = 100_000
_TOKENS = re.compile(r"[0-9]{1,6}")


def tokens(shape: Any) -> int | None:
    """The tokens of an AlphaFold 3 bucket: a whole number from 1 to :data:`MAX_TOKENS`, as a
    number or as ASCII digits (``"²"`` is a digit to ``str.isdigit`` and no number to ``int``);
    None for anything else."""
    if isinstance(shape, int) and not isinstance(shape, bool):
        number = shape
    elif isinstance(shape, str) and _TOKENS.fullmatch(shape):
        number = int(shape)
    else:
        return None
    return number if 1 <= number <= MAX_TOKENS else None


def run_memory_mb(workload: str, builtin: bool, shape: Any) -> int | None:
    """The host memory (MB) one run of ``workload`` at ``shape`` needs, where it is known (None:
    a user's workload, a built-in whose size was not measured, or a shape that is no bucket)."""
    count = tokens(shape) if builtin and workload == "alphafold3" else None
    if count is None:
        return None
    return math.ceil(SAFETY * (AF3_BASE_MB + AF3_PER_TOKEN_MB * count + AF3_PER_TOKEN_SQ_MB * count**2))
