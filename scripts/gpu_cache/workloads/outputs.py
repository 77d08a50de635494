"""What a built-in workload reports for validation's proof that the warm cache computes what a
fresh compile computes (issue 40, docs/outputs.md): its outputs for fixed inputs, as an
``.npz`` at ``$GPU_CACHE_OUTPUTS`` (set by the workload runner in the cold and validate passes
only), and the same outputs of a second run of the same compiled program in the same process
beside it (``outputs.again.npz``): how far the two lie apart is the program's run-to-run noise.

numpy is imported only where outputs are asked for (the workloads' own software has it:
jax, torch and AlphaFold 3 need it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from gpu_cache.core import names
from gpu_cache.core.outputs import again_of


def wanted() -> bool:
    """Whether this run reports its outputs (a workload runs its program a second time only then)."""
    return bool(os.environ.get(names.OUTPUTS_VAR))


def save(first: Mapping[str, Any], again: Mapping[str, Any] | None = None) -> None:
    """Write the outputs of the first run (and of the second, where there was one) by name,
    where the runner asks for them; nothing where it does not."""
    path = os.environ.get(names.OUTPUTS_VAR)
    if not path:
        return
    import numpy as np

    np.savez(path, **{name: as_array(value) for name, value in first.items()})
    if again is not None:
        np.savez(again_of(path), **{name: as_array(value) for name, value in again.items()})


def as_array(value: Any) -> Any:
    """A numpy array of ``value`` (a jax or numpy array, a torch tensor, bytes, a number) that
    the runner reads by its numbers: types numpy's file format does not describe (bfloat16)
    as float32."""
    import numpy as np

    if isinstance(value, (bytes, bytearray)):
        return np.frombuffer(bytes(value), np.uint8)
    if hasattr(value, "detach"):  # a torch tensor: numpy has no bfloat16
        value = value.detach().cpu()
        value = (value.float() if value.is_floating_point() else value).numpy()
    array = np.asarray(value)
    if array.dtype.kind not in "biufc":
        array = array.astype(np.float32)
    return np.asarray(array, order="C")
