# gpu-cache hook piece
# watches jax_triton.triton_lib
# watches-with GPU_CACHE_JAX_TRITON jax_triton.triton_lib
# node-local GPU_CACHE_JAX_TRITON
# tier files
# software jax-triton
# key-environment TRITON_DEFAULT_FP_FUSION TRITON_DISABLE_LINE_INFO
"""gpu-cache's startup hook, the jax-triton piece (issue 34): loaded right after the process
imports ``jax_triton.triton_lib``.

jax-triton compiles every Triton kernel of a JAX program to TTIR and PTX while JAX lowers the
program, in every process (``get_or_create_triton_kernel``, with an in-memory dict only), and
sets ``TRITON_CACHE_DIR=""`` when it is imported. This piece:

- puts back the ``TRITON_CACHE_DIR`` the process started with (jax-triton's empty value makes
  every later Triton compile of the process raise);
- keeps each kernel it compiles in ``$GPU_CACHE_JAX_TRITON`` (``kinds.jax_triton.store``)
  and gives it to every later process, so their lowering skips the compile.

Where it wraps. ``get_or_create_triton_kernel`` differs between jax-triton versions in what it
builds around the compile (``TritonKernel`` takes 9 arguments in 0.2.0 and 7 in 0.3.x; the
specialisation it returns is an ``AttrsDescriptor`` in 0.2.0 and a dict in 0.3.x), but in
0.2.0, 0.3.0 and 0.3.1 it compiles in the same two steps, both looked up at call time:
``code_gen.ast_to_ttir(fn, ASTSource, options=...)`` and ``compile_ttir_inplace(module,
backend, options, compute_capability, platform)``, which returns a ``CompilationResult``
dataclass (PTX, kernel name, shared memory; cluster dimensions in 0.2.0 and 0.3.0). So the
piece wraps those two steps, only inside a call of ``get_or_create_triton_kernel`` (in that
thread), and jax-triton's own code builds the kernel and the specialisation from them in each
version: on a hit ``ast_to_ttir`` returns the kept TTIR and ``compile_ttir_inplace`` the kept
result, and the lowered module is the one a compile gives. jax-triton 0.4 compiles through
``ASTSource.make_ir`` in methods of its ``TritonFunction`` class:
``kinds.jax_triton.functions`` wraps those, with this piece's key, store and record.
A version the pieces do not know is left untouched, and the record says so.

The key: the entry format, jax-triton's version, Triton's own key (its sources and
``libtriton``; once per installation, see the store), ``ASTSource.hash()`` (the JIT function's
``cache_key``, the signature, the specialisation attributes, the constants),
``backend.hash()`` (the ptxas version and the target), the parsed options' ``hash()`` and
Triton's cache-invalidating environment variables: what Triton's own cache key holds, for
the same compile. Not cached (jax-triton's own path): another platform than CUDA, jax-triton's
``debug`` or ``JAX_TRITON_DUMP_DIR`` (they print or write files), and any kernel whose key
cannot be computed. Any failure takes jax-triton's own path with one warning line at most.

With ``$GPU_CACHE_LOCKS``, processes that miss one kernel at once compile it once
(``flight``, across nodes too); with the node-local tier, entries come from and go
to the shared tier. The record's ``jax_triton`` part counts hits and misses and keeps each
key's parts for ``gpu-cache doctor --explain``. Standard library only, Python 3.9+.
"""

import functools
import hashlib
import json
import os
import threading
import time

from ... import common
from ...common import MAX_ITEMS, keep, text
from ...names import JAX_TRITON_VAR as FOLDER_VAR
from ...names import TRITON_CACHE_DIR_VAR
from .steps import Call, KeptModule, kept_compile, result_mismatch, steps_mismatch

KIND = "jax_triton"
#: The versions whose compile steps this piece wraps (read from their sources; the tests run 0.3.1).
KNOWN = ("0.2.0", "0.3.0", "0.3.1")
#: The versions that compile in ``TritonFunction``'s methods (kinds.jax_triton.functions).
KNOWN_FUNCTIONS = ("0.4.0", "0.4.1")
#: Characters of each key part's sha256 kept in records.
_PART_CHARS = 16


def part(hook):
    """The record's ``jax_triton`` part of this process, made on first use."""
    return common.part(hook, KIND, {
        "version": None, "state": "off: not installed yet", "triton_cache_dir": None,
        "triton_key": None, "hits": 0, "misses": 0, "not_cached": 0, "compile_seconds": 0.0,
        "saved_seconds": 0.0, "lookup_seconds": 0.0, "hit_keys": [], "missed": [],
        "not_cached_kernels": [], "refused": [], "key_parts": {},
        "dropped": {"hit_keys": 0, "missed": 0, "not_cached_kernels": 0, "refused": 0, "key_parts": 0}})


def section(hook):
    """The record's ``jax_triton`` part at exit, with single-flight's and the tier's."""
    return common.section(hook, KIND)


def on_import(triton_lib, hook):
    """Run right after ``jax_triton.triton_lib`` is imported (records or not, where
    ``$GPU_CACHE_JAX_TRITON`` names its kernels' folder)."""
    hook.observed(KIND)
    stats = part(hook)
    version = _version()
    stats["version"] = version
    if version not in KNOWN + KNOWN_FUNCTIONS:
        stats["state"] = text(f"untouched: jax-triton {version} is not a version this hook knows "
                              f"({', '.join(KNOWN + KNOWN_FUNCTIONS)})", 300)
        return
    mismatch, install = _mismatch, _install
    if version in KNOWN_FUNCTIONS:
        from . import functions

        mismatch, install = functions.mismatch, functions.install
    _restore_triton_cache_dir(hook, stats)
    folder = os.environ.get(FOLDER_VAR, "")
    if not os.path.isabs(folder):
        stats["state"] = f"off: {FOLDER_VAR} is not set" if not folder else \
            text(f"off: {FOLDER_VAR} is not an absolute path: {folder!r}", 300)
        return
    why = mismatch(triton_lib)
    if why is None and getattr(triton_lib, "_JAX_TRITON_DUMP_DIR", None):
        why = "JAX_TRITON_DUMP_DIR is set (jax-triton writes each compile's files there)"
    if why:
        stats["state"] = text(f"off: {why}", 300)
        return
    try:
        store = _store(folder, hook)
        store.check()
        install(triton_lib, _Kernels(triton_lib, store, hook, stats))
    except Exception as exc:  # jax-triton's own path, as without the hook
        stats["state"] = text(f"off: {exc!r}", 300)
        common.flight_off(hook, KIND, text(f"not installed: {exc!r}", 300))
        hook.warn("jax-triton kernel cache", exc, off=True)
        return
    stats["state"] = "on"


def _version():
    import importlib

    try:
        found = importlib.import_module("jax_triton.version").__version__
    except Exception:
        return None
    return found if isinstance(found, str) else None


def _restore_triton_cache_dir(hook, stats):
    """jax-triton set ``TRITON_CACHE_DIR=""`` (0.2, 0.3) or removed it (0.4): put back the
    folder the process started with."""
    started = hook.started.get(TRITON_CACHE_DIR_VAR)
    if not os.environ.get(TRITON_CACHE_DIR_VAR) and started:
        os.environ[TRITON_CACHE_DIR_VAR] = started
        stats["triton_cache_dir"] = text(f"restored {started}")


def _mismatch(triton_lib):
    """Why this jax-triton's compile steps do not fit the wrappers, or None."""
    steps = [(getattr(triton_lib, name, None), name, params) for name, params in (
        ("get_or_create_triton_kernel", ("backend_init_func", "platform", "fn")),
        ("compile_ttir_inplace", ("ttir", "backend", "options", "compute_capability", "platform")))]
    why = steps_mismatch(steps)
    if why is None and not callable(getattr(getattr(triton_lib, "code_gen", None), "ast_to_ttir", None)):
        why = "jax_triton.triton_lib.code_gen.ast_to_ttir is missing"
    return why or result_mismatch(triton_lib)


def _store(folder, hook):
    from .store import Store

    return Store(folder, common.tier(hook))


class _CodeGen:
    """``triton.compiler.code_generator`` as jax-triton sees it, with ``ast_to_ttir`` wrapped."""

    def __init__(self, module, ast_to_ttir):
        self._module = module
        self.ast_to_ttir = ast_to_ttir

    def __getattr__(self, name):
        return getattr(self._module, name)


def _install(triton_lib, kernels):
    """Wrap jax-triton's kernel function and its two compile steps (module globals, looked up
    at call time); the steps act only inside the kernel function, in its thread."""
    import inspect

    original_get = triton_lib.get_or_create_triton_kernel
    original_compile = triton_lib.compile_ttir_inplace
    code_gen = triton_lib.code_gen
    original_ast = code_gen.ast_to_ttir
    local = threading.local()

    @functools.wraps(original_get)
    def get_or_create_triton_kernel(backend_init_func, platform, *args, **kwargs):
        if getattr(local, "call", None) is not None:
            return original_get(backend_init_func, platform, *args, **kwargs)
        if "torch_import" not in kernels.stats:  # the first kernel of the process
            try:
                from ..triton import no_torch

                kernels.stats["torch_import"] = no_torch.prime()
            except Exception as exc:  # Triton imports torch as it would have
                kernels.stats["torch_import"] = text(f"failed: {exc!r}", 300)
        call = local.call = Call(platform, kwargs.get("dump"))

        def backend_of(*init_args, **init_kwargs):
            call.backend = backend_init_func(*init_args, **init_kwargs)
            return call.backend

        try:
            return original_get(backend_of, platform, *args, **kwargs)
        finally:
            local.call = None
            kernels.finish(call)

    @functools.wraps(original_ast)
    def ast_to_ttir(*args, **kwargs):
        call = getattr(local, "call", None)
        if call is None:
            return original_ast(*args, **kwargs)
        call.ast = (args, kwargs)
        found = kernels.lookup(call, args, kwargs)
        return KeptModule(found) if found is not None else original_ast(*args, **kwargs)

    compile_ttir_inplace = kept_compile(original_compile, kernels, local,
                                        lambda call: original_ast(*call.ast[0], **call.ast[1]))

    try:  # jax-triton 0.2.0 asks ast_to_ttir's signature whether it takes module_map
        ast_to_ttir.__signature__ = inspect.signature(original_ast)
    except (TypeError, ValueError):
        pass
    triton_lib.get_or_create_triton_kernel = get_or_create_triton_kernel
    triton_lib.compile_ttir_inplace = compile_ttir_inplace
    triton_lib.code_gen = _CodeGen(code_gen, ast_to_ttir)


class _Kernels:
    """The cache of this process: keys, lookups, stores, and what the record says."""

    def __init__(self, triton_lib, store, hook, stats):
        import dataclasses

        self.triton_lib, self.store, self.hook, self.stats = triton_lib, store, hook, stats
        from . import store

        self.store_module = store
        self.fields = tuple(f.name for f in dataclasses.fields(triton_lib.CompilationResult))
        self.version = stats["version"]
        self.flight = common.flight(hook) if hook.flight else None
        self._triton_key = None

    # --- the key ---------------------------------------------------------------------------

    def key_of(self, call, args, kwargs):
        """``(key, kernel name, parts)`` of the compile the arguments of ``ast_to_ttir`` ask
        for; None (and why) where it is not cached."""
        from triton.compiler import compiler

        source = next((v for v in (*args, *kwargs.values()) if isinstance(v, compiler.ASTSource)), None)
        options = kwargs.get("options")
        if call.platform != "cuda":
            return None, f"platform {call.platform}"
        if call.dump or getattr(options, "debug", False):
            return None, "jax-triton's debug output is on"
        if source is None or options is None or call.backend is None:
            return None, "ast_to_ttir was called without its ASTSource, options or backend"
        fn = source.fn
        call.module = text(str(getattr(fn, "module", "") or ""), 300)
        name = text(getattr(getattr(fn, "fn", None), "__qualname__", None) or getattr(fn, "__name__", "?"))
        from triton._C.libtriton import get_cache_invalidating_env_vars

        parts = {
            "jax-triton": self.version,
            "triton": self.triton_key(),
            "kernel source": str(fn.cache_key),
            "specialisation": source.hash(),
            "ptxas and target": str(call.backend.hash()),
            "options": options.hash(),
            "environment": str(sorted(get_cache_invalidating_env_vars().items())),
            "platform": str(call.platform),
        }
        whole = json.dumps({"format": self.store_module.FORMAT, **parts}, sort_keys=True)
        key = hashlib.sha256(whole.encode("utf-8", "surrogateescape")).hexdigest()
        digests = {k: hashlib.sha256(v.encode("utf-8", "surrogateescape")).hexdigest()[:_PART_CHARS]
                   for k, v in parts.items()}
        arch = getattr(getattr(call.backend, "target", None), "arch", "?")
        target = f"sm_{arch}" if isinstance(arch, int) else f"{call.platform}:{arch}"
        return (key, name, {**digests, "jax-triton": self.version, "target": target}), None

    def triton_key(self):
        if self._triton_key is None:
            import triton

            try:
                from triton.runtime.cache import triton_key as compute
            except ImportError:  # Triton before 3.4
                from triton.compiler.compiler import triton_key as compute
            self._triton_key = self.store_module.triton_key(
                self.store, compute, os.path.dirname(os.path.abspath(triton.__file__)), self.stats)
        return self._triton_key

    # --- the wrapped steps -----------------------------------------------------------------

    def lookup(self, call, args, kwargs):
        """In ``ast_to_ttir``: the kept entry of this compile (a hit), or None: compile (the
        call then holds the key, and single-flight's lock where another process may compile it
        too). Never raises: a failure is jax-triton's own path."""
        started = time.perf_counter()
        try:
            found, why = self.key_of(call, args, kwargs)
            if found is None:
                self._not_cached(why)
                return None
            call.key, call.name, call.parts = found
            entry = self._read(call)
            if entry is None and self.flight is not None and self.flight.enabled(KIND):
                entry, call.lock = self.flight.lead(KIND, call.key, self.store.where(),
                                                    lambda: self._read(call), lambda: self._read(call))
            if entry is not None:
                self._counted(call, hit=True, entry=entry)
                return entry
        except Exception as exc:
            keep(self.stats, "refused", text(f"{exc!r}", 300))
            self.hook.warn("jax-triton kernel cache", exc)
            call.key = None
            self._release(call, wrote=False)
            return None
        finally:
            self.stats["lookup_seconds"] += time.perf_counter() - started
        self._counted(call, hit=False)
        return None

    def _read(self, call):
        """The entry of ``call.key`` (None: none, or one not usable, which the store set aside
        and the compile replaces). Raises OSError, tier.files.Refused (the folder)."""
        target = call.parts["target"]
        try:
            return self.store.load(call.key, lambda entry: self.store_module.problem(
                entry, self.version, self.fields, target))
        except self.store_module.Unusable as exc:
            keep(self.stats, "refused", text(str(exc), 300))
            return None

    def result(self, entry):
        """jax-triton's ``CompilationResult`` of an entry the store checked (lists back to
        tuples)."""
        kept = entry["result"]
        return self.triton_lib.CompilationResult(
            **{k: tuple(v) if isinstance(v, list) else v for k, v in kept.items()})

    def save(self, call, ttir, result, seconds):
        """After a compile: keep it, and let single-flight's waiters go. Never raises."""
        import dataclasses

        self.stats["compile_seconds"] += seconds
        wrote = False
        try:
            fields = dataclasses.asdict(result)
            entry = {"format": self.store_module.FORMAT, "key": call.key, "kernel": call.name,
                     "module": call.module, "name": text(fields.get("name", "?")), "jax_triton": self.version,
                     "triton": _triton_version(), "target": call.parts["target"],
                     "compile_seconds": round(seconds, 6), "parts": call.parts,
                     "result": fields, "ttir": ttir}
            self.store.write(call.key, self.store_module.sealed(entry))
            wrote = True
        except Exception as exc:  # a read-only or full folder: compiled again next time
            self.hook.warn("jax-triton kernel cache (write)", exc)
        finally:
            self._release(call, wrote)

    def finish(self, call):
        """After ``get_or_create_triton_kernel``: a lock still held is released (its compile
        failed, or wrote nothing)."""
        self._release(call, wrote=False)

    def _release(self, call, wrote):
        lock, call.lock = call.lock, None
        if lock is not None:
            lock.release(wrote=wrote)

    # --- what the record says --------------------------------------------------------------

    def _counted(self, call, hit, entry=None):
        stats = self.stats
        parts = stats["key_parts"]
        if call.key in parts or len(parts) < MAX_ITEMS:
            parts[call.key] = {"name": call.name, **call.parts}
        else:
            stats["dropped"]["key_parts"] += 1
        if hit:
            stats["hits"] += 1
            keep(stats, "hit_keys", call.key)
            seconds = entry.get("compile_seconds")
            if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds > 0:
                stats["saved_seconds"] += float(seconds)
        else:
            stats["misses"] += 1
            keep(stats, "missed", {"name": call.name, "key": call.key})

    def _not_cached(self, why):
        self.stats["not_cached"] += 1
        keep(self.stats, "not_cached_kernels", text(why, 300))


def _triton_version():
    import sys

    found = getattr(sys.modules.get("triton"), "__version__", None)
    return found if isinstance(found, str) else "?"

