"""gpu-cache's startup hook, the jax-triton piece for jax-triton 0.4.x (issue 39), loaded by
``kinds.jax_triton`` for those versions.

jax-triton 0.4 moved the compile out of the free function ``get_or_create_triton_kernel`` into
methods of its ``TritonFunction`` class (jax-ml/jax-triton#385): ``get_or_create_kernel`` keeps an
in-memory cache per kernel function and calls ``_compile_kernel(spec, gpu_target, backend,
backend_options)``, which builds ``tc.ASTSource(fn, signature, constants, attrs)``, calls its
``make_ir(gpu_target, options, codegen_fns, module_map, context)`` (the TTIR), then the module
function ``compile_ttir_inplace(module, backend, options, gpu_target)`` (the PTX, in a
``CompilationResult`` dataclass), and builds jaxlib's ``TritonKernel`` from the result. Both
steps are looked up at call time (``tc`` is ``triton.compiler.compiler``, a module global).

So this piece wraps the same two steps as for 0.2 and 0.3, only inside a call of
``_compile_kernel`` (in that thread): ``make_ir`` returns the kept TTIR on a hit and
``compile_ttir_inplace`` the kept result, and jax-triton builds the kernel from them as after a
compile. The key, the store, single-flight and the record are the 0.2/0.3 piece's (its
``_Kernels``): the ASTSource's ``hash()``, the backend's, the parsed options', Triton's own key,
its cache-invalidating variables. Gluon kernels (their own ASTSource class) are not cached.
Standard library only, Python 3.9+.
"""

import functools
import threading

from ...common import text
from .steps import Call, KeptModule, kept_compile, result_mismatch, steps_mismatch


def mismatch(triton_lib):
    """Why this jax-triton's compile steps do not fit the wrappers, or None."""
    function = getattr(triton_lib, "TritonFunction", None)
    wanted = ((getattr(function, "_compile_kernel", None), "TritonFunction._compile_kernel",
               ("self", "spec", "gpu_target", "backend", "backend_options")),
              (getattr(triton_lib, "compile_ttir_inplace", None), "compile_ttir_inplace",
               ("ttir", "backend", "options", "gpu_target")),
              (getattr(getattr(getattr(triton_lib, "tc", None), "ASTSource", None), "make_ir", None),
               "tc.ASTSource.make_ir", ("self", "target", "options", "codegen_fns", "module_map", "context")))
    return steps_mismatch(wanted) or result_mismatch(triton_lib)


def install(triton_lib, kernels):
    """Wrap ``TritonFunction._compile_kernel`` and its two compile steps."""
    function = triton_lib.TritonFunction
    original_kernel = function._compile_kernel
    original_compile = triton_lib.compile_ttir_inplace
    compiler = triton_lib.tc
    local = threading.local()

    class ASTSource(compiler.ASTSource):
        def make_ir(self, *args, **kwargs):
            call = getattr(local, "call", None)
            if call is None:
                return super().make_ir(*args, **kwargs)
            call.ast = (self, args, kwargs)
            options = args[1] if len(args) > 1 else kwargs.get("options")
            found = kernels.lookup(call, (self,), {"options": options})
            return KeptModule(found) if found is not None else super().make_ir(*args, **kwargs)

    @functools.wraps(original_kernel)
    def _compile_kernel(self, spec, gpu_target, backend, *args, **kwargs):
        if getattr(local, "call", None) is not None:
            return original_kernel(self, spec, gpu_target, backend, *args, **kwargs)
        _prime_torch(kernels)
        call = local.call = Call(str(getattr(gpu_target, "backend", "?")), False)
        call.backend = backend
        try:
            return original_kernel(self, spec, gpu_target, backend, *args, **kwargs)
        finally:
            local.call = None
            kernels.finish(call)

    def remake(call):
        source, ast_args, ast_kwargs = call.ast
        return compiler.ASTSource.make_ir(source, *ast_args, **ast_kwargs)

    compile_ttir_inplace = kept_compile(original_compile, kernels, local, remake)

    function._compile_kernel = _compile_kernel
    triton_lib.compile_ttir_inplace = compile_ttir_inplace
    triton_lib.tc = _with(compiler, ASTSource=ASTSource)


def _with(module, **names):
    """A copy of ``module``'s namespace with ``names`` replaced (jax-triton looks up
    ``tc.ASTSource`` at call time; Triton's own module is left as it is)."""
    import types

    copy = types.ModuleType(module.__name__, module.__doc__)
    copy.__dict__.update(vars(module))
    copy.__dict__.update(names)
    return copy


def _prime_torch(kernels):
    """Before the first kernel of the process: Triton imports torch as it would have."""
    if "torch_import" not in kernels.stats:
        try:
            from ..triton import no_torch

            kernels.stats["torch_import"] = no_torch.prime()
        except Exception as exc:
            kernels.stats["torch_import"] = text(f"failed: {exc!r}", 300)
