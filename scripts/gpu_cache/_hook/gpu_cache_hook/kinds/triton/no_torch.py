"""gpu-cache's startup hook: Triton's argument specialisation made without importing torch
(issue 34), for a jax-triton process that has not imported torch itself.

Triton's native ``native_specialize_impl`` (``python/src/specialize.cc``) imports ``torch`` the
first time it is called in a process, only to register ``torch.Tensor`` for a fast path; when
the import fails it goes on without (``PyErr_Clear``), and a tensor is then specialised through
its ``data_ptr`` attribute by the very same handler, to the very same type and key. jax-triton
calls it in every process while JAX lowers, for every kernel, and a JAX program has no use for
torch: on the H200 image (torch 2.11, its sources without bytecode) that import was 3 to 4 s of
a warm process's 8 s (``tests/benchmarks/jax_triton_profile.py --who-imports torch``).

:func:`prime` calls it once first, with the import of ``torch`` refused in this thread for that
call alone (every other module Triton imports there is imported before, as usual). A process
that imports torch later gets it as ever; only Triton's fast path for ``torch.Tensor`` stays
off there. Nothing happens where torch is imported already, where this Triton has no native
specialisation, or with ``GPU_CACHE_TRITON_TORCH=1``. Standard library only, Python 3.9+.
"""

import importlib
import os
import sys
import threading

from ...names import TRITON_TORCH_VAR as SWITCH

#: What Triton's native specialisation imports at its first call, besides torch.
_ITS_IMPORTS = ("triton._utils", "triton.runtime.jit", "triton.tools.tensor_descriptor",
                "triton.experimental.gluon.nvidia.hopper", "triton.language")
_DONE = []


class _NoTorchHere:
    """Refuses ``import torch`` in one thread; every other import goes on as without it."""

    def __init__(self):
        self.thread = threading.get_ident()

    def find_spec(self, name, path=None, target=None):
        if name == "torch" and threading.get_ident() == self.thread:
            raise ModuleNotFoundError("torch is not imported for Triton's specialisation", name="torch")
        return None


def prime():
    """Make Triton's native specialisation ready without torch, once per process. Returns what
    it did, for the record."""
    if _DONE:
        return _DONE[0]
    _DONE.append(_prime())
    return _DONE[0]


def _prime():
    if os.environ.get(SWITCH) == "1":
        return f"off: {SWITCH}=1"
    if "torch" in sys.modules:
        return "not needed: torch is imported already"
    try:
        from triton._C import libtriton
    except ImportError as exc:
        return f"not needed: {exc}"
    native = getattr(libtriton, "native_specialize_impl", None)
    if native is None:
        return "not needed: this triton has no native specialisation"
    for name in _ITS_IMPORTS:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # this Triton has no such module: its specialisation does not import it either
    if "torch" in sys.modules:
        return "not needed: Triton imported torch already"
    refusal = _NoTorchHere()
    sys.meta_path.insert(0, refusal)
    try:
        native(None, 16, False, True, True)  # an int: the backend is not looked at
    finally:
        sys.meta_path.remove(refusal)
    return "applied: Triton's specialisation did not import torch"
