"""gpu-cache's startup hook, the jax-triton piece's wrappers of jax-triton's compile steps that
both its lines share (0.2/0.3 in the piece, 0.4 in ``functions``): whether the steps are the ones
the wrappers fit, what a hit hands jax-triton, and the compile wrapped. Standard library only,
Python 3.9+.
"""

import functools
import time


def steps_mismatch(steps):
    """Why one of ``steps`` ((function or None, its name in triton_lib, the parameters it must
    start with), ...) is missing or takes other parameters, or None."""
    import inspect

    for func, name, params in steps:
        try:
            names = tuple(inspect.signature(func).parameters)
        except (TypeError, ValueError):
            return f"jax_triton.triton_lib.{name} is missing"
        if names[:len(params)] != params:
            return f"jax_triton.triton_lib.{name}{names[:len(params)]} is not {name}{params}"
    return None


def result_mismatch(triton_lib):
    """Why jax-triton's ``CompilationResult`` is not the one the store keeps, or None."""
    import dataclasses

    result = getattr(triton_lib, "CompilationResult", None)
    if not dataclasses.is_dataclass(result):
        return "jax_triton.triton_lib.CompilationResult is not a dataclass"
    if not {"binary", "name", "shared_mem_bytes"} <= {f.name for f in dataclasses.fields(result)}:
        return "jax_triton.triton_lib.CompilationResult lacks binary, name or shared_mem_bytes"
    return None


class KeptModule:
    """What ``ast_to_ttir`` (0.4: ``ASTSource.make_ir``) returns on a hit: the kept TTIR
    (jax-triton only prints it and passes it on to ``compile_ttir_inplace``)."""

    def __init__(self, entry):
        self.entry = entry

    def __str__(self):
        return self.entry["ttir"]


def kept_compile(original_compile, kernels, local, remake):
    """jax-triton's ``compile_ttir_inplace``, wrapped: a kept module's result without a compile
    (``remake(call)``: the module to compile where the kept result cannot be used), else the
    compile, whose result is kept under the call's key."""
    @functools.wraps(original_compile)
    def compile_ttir_inplace(module, *args, **kwargs):
        call = getattr(local, "call", None)
        if isinstance(module, KeptModule):
            try:
                return kernels.result(module.entry)
            except Exception as exc:  # (checked when it was read): compile after all
                kernels.hook.warn("jax-triton kernel cache", exc)
                return original_compile(remake(call), *args, **kwargs)
        ttir = None
        if call is not None and call.key is not None:
            try:
                ttir = str(module)  # before the compile, which changes the module in place
            except Exception as exc:
                kernels.hook.warn("jax-triton kernel cache", exc)
        started = time.perf_counter()
        result = original_compile(module, *args, **kwargs)
        if ttir is not None:
            kernels.save(call, ttir, result, time.perf_counter() - started)
        return result
    return compile_ttir_inplace


class Call:
    """One call of ``get_or_create_triton_kernel`` (0.4: ``TritonFunction._compile_kernel``):
    its platform, backend, key and lock."""

    def __init__(self, platform, dump):
        self.platform, self.dump = platform, bool(dump)
        self.backend = None
        self.key = self.name = self.parts = self.module = None
        self.ast = ((), {})  # ast_to_ttir's arguments
        self.lock = None
