"""Replay: compile the Triton kernels that jobs recorded, on all cores at once (issue 26).

Run it in the jobs' own software, with the cache environment (``gpu-cache warm`` runs it
before the workloads when the records describe kernels; see docs/single-flight.md)::

    TRITON_CACHE_DIR=/abs/cache python -m gpu_cache.workloads.triton_replay \
        [--records DIR] [--jobs N] [--targets sm_90]

The startup hook describes each kernel a job compiles (the record's ``triton.kernels``: the
JIT function's module and qualname, signature, constants, attributes, the options the launch
set and the target). This imports each module once, finds the function, and compiles every
described kernel ahead of time with Triton's own ``compile`` (``ASTSource`` with the same
signature, constants and attributes, the same options: what ``JITFunction.run`` hands it, so
the key is the job's), in a pool of ``--jobs`` processes forked after the imports (an FLA
module costs seconds to import; forked workers share it). Each Triton compile is
single-threaded, so a GPU type's kernels compile about ``--jobs`` times faster than one job
compiles them in turn. Under single-flight (``$GPU_CACHE_LOCKS``), a job that needs a kernel
the replay is compiling waits for it instead of compiling it too.

Records made under another Triton or another version of the kernels' package compile with
what is installed (the source comes from the installed module): that is the case after an
upgrade. A kernel whose module is gone, whose function is not found or whose signature no
longer binds is skipped with one line on stderr, never a failure. Standard library and triton
only, Python 3.9+; without triton, or without described kernels, it does nothing.

Then it writes Triton's autotune result file for each autotune choice the records keep (the
hook's ``triton.autotuned``), so that a later process with ``TRITON_CACHE_AUTOTUNING=1`` or
``autotune(cache_results=True)`` takes the recorded config instead of benchmarking them all
(:func:`write_choices`).

Prints one JSON line: kernels described, compiled, already in the cache, skipped, failed, the
keys that agree with the recorded ones (same Triton), seconds and processes; autotune choices
recorded, written, already present and skipped. Exit codes: 0
(whatever happened to single kernels), 2 bad arguments or environment.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from gpu_cache.core import hook_records, names, safe_io
from gpu_cache.core.errors import UsageError
from gpu_cache.core.kinds import triton_replay as recorded
from gpu_cache.core.shown import shown

PROG = "triton-replay"
_TASKS: list[tuple[Any, ...]] = []  # what each forked worker compiles, by index


class Skip(Exception):
    """A recorded kernel this software cannot compile again; the message says why."""


def _resolve_function(path: str, modules: dict[str, Any]) -> Any:
    """The JIT function ``module:qualname`` (an autotuner or heuristics around it unwrapped).

    Raises:
        Skip: the module does not import or has no such JIT function.
    """
    from triton.runtime.jit import JITFunction

    module_name, _, qualname = path.partition(":")
    if module_name not in modules:
        try:
            modules[module_name] = importlib.import_module(module_name)
        except Exception as exc:  # noqa: BLE001 - the package is gone, or fails to import here
            modules[module_name] = exc
    module = modules[module_name]
    if isinstance(module, Exception):
        raise Skip(f"module {module_name} does not import: {type(module).__name__}: {_first_line(module)}")
    found: Any = module
    for name in qualname.split("."):
        found = getattr(found, name, None)
    while found is not None and not isinstance(found, JITFunction):
        found = getattr(found, "fn", None)  # Autotuner and Heuristics wrap the JIT function
    if found is None:
        raise Skip(f"{module_name} has no Triton kernel {qualname}")
    return found


#: A recorded value nested deeper than this is no value the hook wrote.
MAX_DEPTH = 32
#: The forms ``encode`` writes (the hook's ``kinds.triton``), and those an option may take.
TAGS = frozenset({"tuple", "float", "constexpr", "dtype", "jit_function"})
OPTION_TAGS = frozenset({"tuple", "float"})


def decode(value: Any, modules: dict[str, Any], tags: frozenset[str] = TAGS, depth: int = 0) -> Any:
    """The value the hook's ``encode`` wrote (the hook's ``kinds.triton``), taking only
    the forms in ``tags``.

    Raises:
        Skip: a value this software cannot make (an unknown dtype, a missing JIT function), or
        one of a form the hook never writes there (a record is whatever is in the folder).
    """
    if depth > MAX_DEPTH:
        raise Skip(f"a recorded value nested deeper than {MAX_DEPTH}")
    if isinstance(value, list):
        return [decode(v, modules, tags, depth + 1) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) != 1 or next(iter(value)) not in tags:
        raise Skip(f"a recorded value of unknown form {shown(str(sorted(value))[:100])}")
    (tag, inner), = value.items()
    if tag == "tuple" and isinstance(inner, list):
        return tuple(decode(v, modules, tags, depth + 1) for v in inner)
    if tag == "float" and isinstance(inner, (str, int, float)) and not isinstance(inner, bool):
        try:
            return float(inner)
        except ValueError:
            raise Skip(f"a float of text {shown(inner[:50])!r}") from None
    if tag == "constexpr":
        import triton.language as tl

        return tl.constexpr(decode(inner, modules, tags, depth + 1))
    if tag == "dtype" and isinstance(inner, str):
        import triton.language as tl

        try:
            return tl.dtype(inner)
        except Exception as exc:
            raise Skip(f"dtype {shown(inner[:50])!r} is unknown to this triton") from exc
    if tag == "jit_function" and isinstance(inner, str):
        return _resolve_function(inner, modules)
    raise Skip(f"a recorded {tag} of the wrong type ({type(inner).__name__})")


def prepare(kernel: dict[str, Any], modules: dict[str, Any]) -> tuple[Any, ...]:
    """What compiles one described kernel: (name, JIT function, signature, constants,
    attributes, target, options).

    Raises:
        Skip: this software cannot compile it as described.
    """
    import triton
    from triton.backends.compiler import GPUTarget

    fn = _resolve_function(f"{kernel['module']}:{kernel['qualname']}", modules)
    signature = {str(k): decode(v, modules) for k, v in kernel["signature"].items()}
    if list(signature) != list(fn.arg_names):
        raise Skip(f"the signature no longer binds: recorded ({', '.join(signature)}), "
                   f"installed ({', '.join(fn.arg_names)})")
    places = len(signature)

    def paths(pairs: list[list[Any]]) -> dict[tuple[int, ...], Any]:
        out = {}
        for path, value in pairs:
            if not path or not all(isinstance(i, int) for i in path) or not 0 <= path[0] < places:
                raise Skip(f"the signature no longer binds: argument {path} of {places}")
            out[tuple(path)] = decode(value, modules)
        return out

    constants, attrs = paths(kernel["constants"]), paths(kernel["attrs"])
    target = kernel["target"]
    try:
        gpu = GPUTarget(str(target["backend"]), _plain_arch(target["arch"]), int(target["warp_size"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise Skip(f"an odd target {shown(repr(target)[:200])}") from exc
    options = {str(k): decode(v, modules, OPTION_TAGS) for k, v in kernel["options"].items()}
    if kernel.get("triton") == triton.__version__:  # Triton's own compile call, as the job made it
        return (kernel["qualname"], fn, signature, constants, attrs, gpu, options, kernel.get("key"))
    # Another Triton may specialise and key differently: launch it ahead of time with arguments
    # like the job's, and this Triton derives what its own jobs will.
    args = [launch_argument(kind, constants.get((i,)), attrs.get((i,)) or [])
            for i, kind in enumerate(signature.values())]
    known = _option_names(gpu)
    return (kernel["qualname"], fn, args, None, None, gpu, {k: v for k, v in options.items() if k in known},
            None)


def _plain_arch(arch: Any) -> int | str:
    """A target's architecture as recorded: a number (CUDA) or a name (HIP).

    Raises:
        TypeError: anything else.
    """
    if not isinstance(arch, (int, str)) or isinstance(arch, bool):
        raise TypeError(f"an architecture of type {type(arch).__name__}")
    return arch


_OPTION_NAMES: dict[Any, frozenset[str]] = {}


def _option_names(target: Any) -> frozenset[str]:
    """The options this Triton's backend for ``target`` takes (a launch may set no other)."""
    if target not in _OPTION_NAMES:
        from triton.compiler.compiler import make_backend

        _OPTION_NAMES[target] = frozenset(vars(make_backend(target).parse_options({})))
    return _OPTION_NAMES[target]


def launch_argument(kind: Any, constant: Any, attrs: list[Any]) -> Any:
    """An argument whose specialisation is the recorded one: the constant itself; a pointer
    (a Triton ``MockTensor``) at an address 16-byte aligned or not; an integer of the recorded
    width, divisible by 16 or not; a float.

    Raises:
        Skip: an argument of a kind this cannot make (a tensor descriptor, a tuple).
    """
    import triton.language as tl
    from triton.runtime.jit import MockTensor

    aligned = any(isinstance(a, list) and a[:1] == ["tt.divisibility"] for a in attrs)
    if kind == "constexpr":
        return constant
    if isinstance(kind, str) and kind.startswith("*"):
        class Pointer(MockTensor):
            def data_ptr(self) -> int:
                return 0 if aligned else 8

        return Pointer(tl.dtype(kind.lstrip("*").lstrip("k")))
    base = {"i32": 1 << 4, "i64": 1 << 40, "u64": (1 << 63) + (1 << 4)}.get(kind)
    if base is not None:
        return base if aligned else base + 1
    if kind in ("fp32", "fp64"):
        return 1.5
    if kind == "i1":
        return True
    raise Skip(f"an argument of kind {kind!r} cannot be made ahead of time")


def compile_one(index: int) -> dict[str, Any]:
    """Compile task ``index`` of :data:`_TASKS` (in a forked worker or in this process)."""
    import triton
    from triton.compiler import ASTSource

    name, fn, signature, constants, attrs, target, options, recorded_key = _TASKS[index]
    seen: dict[str, Any] = {}
    previous = triton.knobs.compilation.listener

    def listener(**kwargs: Any) -> None:
        seen["hit"] = bool(kwargs["cache_hit"])
        if previous is not None:
            previous(**kwargs)

    started = time.perf_counter()
    triton.knobs.compilation.listener = listener
    try:
        if constants is None:  # launched ahead of time, on a driver that knows only the target
            from gpu_cache.workloads.triton_kernels import target_only_driver

            with target_only_driver([target.arch]):
                kernel = fn.run(*signature, grid=(1,), warmup=True, **options)
        else:
            source = ASTSource(fn, signature, constants, attrs)
            kernel = triton.compile(source, target=target, options=options)
        group = getattr(kernel, "metadata_group", {}) or {}
        key = next((os.path.basename(os.path.dirname(p)) for p in group.values()), None)
        return {"index": index, "name": name, "hit": seen.get("hit"), "key": key,
                "same_key": None if not recorded_key else key == recorded_key,
                "seconds": time.perf_counter() - started}
    except Exception as exc:  # noqa: BLE001 - one kernel's error is that kernel's, never the replay's
        return {"index": index, "name": name, "error": f"{type(exc).__name__}: {_last_line(exc)}",
                "seconds": time.perf_counter() - started}
    finally:
        triton.knobs.compilation.listener = previous


def replay(kernels: Sequence[dict[str, Any]], jobs: int, targets: Sequence[int] | None = None,
           warn: Any = None) -> dict[str, Any]:
    """Compile ``kernels`` (descriptions from records) into ``TRITON_CACHE_DIR``, ``jobs`` at a
    time; only those for ``targets`` (compute capabilities) when given. Returns the summary."""
    warn = warn or (lambda line: print(f"{PROG}: {line}", file=sys.stderr, flush=True))
    started = time.perf_counter()
    modules: dict[str, Any] = {}
    skipped = 0
    del _TASKS[:]
    for kernel in kernels:
        if targets is not None and kernel["target"].get("arch") not in targets:  # ints: == only
            continue
        try:
            _TASKS.append(prepare(kernel, modules))
        except Exception as exc:  # noqa: BLE001 - one odd description is one skipped kernel
            skipped += 1
            why = exc if isinstance(exc, Skip) else f"an odd description ({type(exc).__name__}: " \
                f"{_first_line(exc)})"
            warn(shown(f"skipped {kernel['module'][:200]}:{kernel['qualname'][:200]}: {why}"))
    prepared = time.perf_counter() - started
    processes = max(1, min(jobs, len(_TASKS)))
    if processes == 1:
        results = [compile_one(i) for i in range(len(_TASKS))]
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # Forked: the workers share the imported modules (and the hook's single-flight manager).
        with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("fork")) as pool:
            results = list(pool.map(compile_one, range(len(_TASKS))))
    failed = [r for r in results if "error" in r]
    for result in failed:
        warn(f"compiling {result['name']} failed: {result['error']}")
    done = [r for r in results if "error" not in r]
    checked = [r for r in done if r["same_key"] is not None]
    return {"workload": PROG, "described": len(kernels), "replayed": len(_TASKS),
            "compiled": sum(1 for r in done if r["hit"] is False),
            "cached": sum(1 for r in done if r["hit"] is not False),
            "skipped": skipped, "failed": len(failed),
            "same_key": sum(1 for r in checked if r["same_key"]), "key_checked": len(checked),
            "processes": processes, "import_seconds": round(prepared, 3),
            "seconds": round(time.perf_counter() - started, 3),
            "compile_seconds": round(sum(r["seconds"] for r in results), 3)}


def write_choices(choices: Sequence[dict[str, Any]], targets: Sequence[int] | None = None,
                  warn: Any = None) -> dict[str, int]:
    """Write Triton's autotune result file (``<fn>.autotune.json`` in a key folder of
    ``TRITON_CACHE_DIR``) for each recorded choice, as ``Autotuner.check_disk_cache`` of this
    Triton would after benchmarking (same key, same JSON), so that a process with
    ``TRITON_CACHE_AUTOTUNING=1`` or ``cache_results=True`` takes the choice instead of
    benchmarking every config again on the GPU. Only choices recorded under this very Triton
    (another one keys and prints configs otherwise) and this very kernel source (the function's
    ``cache_key``); never over an existing file. Returns the counts."""
    import base64
    import hashlib

    import triton
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.runtime.autotuner import Config
    from triton.runtime.cache import triton_key

    warn = warn or (lambda line: print(f"{PROG}: {line}", file=sys.stderr, flush=True))
    counts = {"autotune_written": 0, "autotune_present": 0, "autotune_skipped": 0}
    mine = [c for c in choices if targets is None or c["target"].get("arch") in targets]
    others = sorted({c["triton"] for c in mine if c["triton"] != triton.__version__})
    if others:
        counts["autotune_skipped"] += sum(1 for c in mine if c["triton"] != triton.__version__)
        warn(f"{counts['autotune_skipped']} autotune choices recorded under triton {', '.join(others)} not "
             f"written: this is triton {triton.__version__}, whose result files are keyed otherwise")
    modules: dict[str, Any] = {}
    env = str(sorted(get_cache_invalidating_env_vars().items()))
    for choice in (c for c in mine if c["triton"] == triton.__version__):
        name = f"{choice['module']}:{choice['qualname']}"
        try:
            fn = _resolve_function(name, modules)
            if fn.cache_key != choice["cache_key"]:
                raise Skip("its source changed since it was tuned")
            target = choice["target"]
            backend = make_backend(GPUTarget(str(target["backend"]), _plain_arch(target["arch"]),
                                             int(target["warp_size"])))
            configs = [str(Config(**config)) for config, _timings in choice["configs_timings"]]
            # Autotuner.check_disk_cache's key and file, as this Triton computes and writes them
            parts = [triton_key(), backend.hash(), fn.cache_key, env, choice["key_text"], *configs]
            key = hashlib.sha256("-".join(parts).encode("utf-8")).hexdigest()
            timings = [[config, decode(times, modules, OPTION_TAGS)]
                       for config, times in choice["configs_timings"]]
            data = json.dumps({"key": choice["key"], "configs_timings": timings})
            # the folder get_cache_manager(key) names: the digest in base32, unpadded
            folder = Path(triton.knobs.cache.dir, base64.b32encode(bytes.fromhex(key)).decode().rstrip("="))
            folder.mkdir(parents=True, exist_ok=True)
            added = safe_io.add_file(folder / f"{fn.__name__[:150]}.autotune.json", data.encode())
            counts["autotune_written" if added else "autotune_present"] += 1
        except Skip as exc:
            counts["autotune_skipped"] += 1
            warn(shown(f"autotune choice of {name} not written: {exc}"))
        except Exception as exc:  # noqa: BLE001 - one odd choice is one choice not written
            counts["autotune_skipped"] += 1
            warn(shown(f"autotune choice of {name} not written: {type(exc).__name__}: {_last_line(exc)}"))
    return counts


def parse_targets(text: str) -> list[int]:
    """``sm_80,sm_90`` as compute capabilities.

    Raises:
        UsageError: an item is not ``sm_<digits>``.
    """
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items or not all(i.startswith("sm_") and i[3:].isdigit() and len(i) <= 6 for i in items):
        raise UsageError(f"bad --targets {text!r}: expected e.g. sm_90 or sm_80,sm_90")
    return [int(i[3:]) for i in items]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else ""


def _last_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[-1][:300] if text else ""


def _cores() -> int:
    """The cores this process may run on (a SLURM job's, not the node's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="python -m gpu_cache.workloads.triton_replay",
                            description="Compile the Triton kernels the records describe, in parallel.")
    parser.add_argument("--records", default=os.environ.get(names.RECORDS_VAR),
                        help=f"the records folder (default: ${names.RECORDS_VAR})")
    parser.add_argument("--jobs", type=int, default=_cores(),
                        help="processes at once (default: the cores this process may use); 1 compiles "
                             "in turn")
    parser.add_argument("--targets", default=None,
                        help="only kernels recorded for these targets, e.g. sm_90 (default: all)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit code."""
    try:
        args = _parser().parse_args(argv)
        if not args.records or not os.path.isabs(args.records):
            raise UsageError(f"no records folder: give --records or export an absolute {names.RECORDS_VAR}")
        if args.jobs < 1:
            raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
        cache_dir = os.environ.get(names.TRITON_CACHE_DIR_VAR, "")
        if not os.path.isabs(cache_dir):
            raise UsageError("TRITON_CACHE_DIR is not an absolute folder: export the cache's "
                             "(refusing to fall back to ~/.triton)")
        targets = parse_targets(args.targets) if args.targets else None
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    found = list(hook_records.read(Path(args.records)))
    kernels, choices = recorded.kernels(found), recorded.autotuned(found)
    if not (kernels or choices):
        print(json.dumps({"workload": PROG, "described": 0}), flush=True)
        return 0
    try:
        import triton  # noqa: F401 - only to say so when it is missing
    except ImportError as exc:
        print(f"{PROG}: {len(kernels)} kernels recorded, but triton does not import here: {exc}",
              file=sys.stderr)
        print(json.dumps({"workload": PROG, "described": len(kernels), "replayed": 0}), flush=True)
        return 0
    summary = replay(kernels, args.jobs, targets)
    # after compiling: a choice only helps a process that finds the kernels compiled, too
    summary.update(write_choices(choices, targets), autotune_recorded=len(choices))
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
