"""Triton's argument specialisation made without importing torch (the hook's ``kinds.triton.no_torch``).

Triton 3.6's native specialisation imports torch at its first call in a process, which cost a
warm jax-triton process on the H200 3 to 4 s of its 8 (``tests/benchmarks/results/
jax_triton_warm_profile.txt``). The hook makes that first call with the import refused. What must
hold, with the real Triton and the real torch installed here: torch is not imported by it, and a
process that imports torch afterwards specialises its tensors exactly as a process without the
hook does.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import HOOK, clean_environ

#: Specialise torch tensors (aligned, and one element off) and plain values; print the results.
SPECIALISE = """
import json, sys
sys.path.insert(0, {hook!r})
if {prime}:
    from gpu_cache_hook.kinds.triton import no_torch
    said = no_torch.prime()
    assert "torch" not in sys.modules, "the prime imported torch"
else:
    said = None
import torch
from triton._C import libtriton
import triton.backends.nvidia.compiler as cb
backend = cb.CUDABackend(cb.GPUTarget("cuda", 90, 32))
x = torch.zeros(64)
values = [x, x[1:], torch.zeros(8, dtype=torch.float16), 16, 17, 2 ** 40, 1.5, True, None]
out = [list(libtriton.native_specialize_impl(backend, v, False, True, True)) for v in values]
print(json.dumps({{"said": said, "specialised": [[str(a), str(b)] for a, b in out]}}))
"""


def specialise(prime: bool) -> dict:
    done = subprocess.run([sys.executable, "-c", SPECIALISE.format(hook=str(HOOK), prime=prime)],
                          env=clean_environ(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_tensors_are_specialised_alike_after_a_first_call_without_torch():
    pytest.importorskip("torch")
    primed, plain = specialise(True), specialise(False)
    assert primed["said"] == "applied: Triton's specialisation did not import torch"
    assert primed["specialised"] == plain["specialised"]
    assert plain["specialised"][:2] == [["*fp32", "D"], ["*fp32", ""]]


def test_nothing_is_done_where_torch_is_imported_already_or_switched_off(monkeypatch):
    code = (f"import sys, os; sys.path.insert(0, {str(HOOK)!r}); {{first}}"
            "import gpu_cache_hook.kinds.triton.no_torch as n; print(n.prime())")
    said = [subprocess.run([sys.executable, "-c", code.format(first=first)], env=clean_environ(**extra),
                           capture_output=True, text=True, timeout=300).stdout.strip()
            for first, extra in (("import torch; ", {}), ("", {"GPU_CACHE_TRITON_TORCH": "1"}))]
    assert said == ["not needed: torch is imported already", "off: GPU_CACHE_TRITON_TORCH=1"]
