# gpu-cache hook piece
# watches triton
# makes TRITON_CACHE_DIR
# node-local TRITON_CACHE_DIR TRITON_HOME
# tier folders __grp__
# software triton
# key-environment TRITON_DEFAULT_FP_FUSION TRITON_DISABLE_LINE_INFO
"""gpu-cache's startup hook, the Triton piece: loaded when the process imports ``triton``.

Triton's compilation listener counts hits and misses (and marks each hit entry used), and
describes each kernel it compiles well enough to compile it again without the job (the
record's ``kernels``, which ``gpu-cache warm`` replays on all cores: issue 26), and keeps the
config Triton's autotuner chose for each autotune key it looked up on disk (``autotuned``,
which the replay writes back as Triton's own ``*.autotune.json``); with
``$GPU_CACHE_LOCKS``, Triton's cache manager becomes gpu-cache's single-flight one
(``kinds.triton.seed.FlightCacheManager``), and with the node-local tier the tier's
(``kinds.triton.tier_manager.TierCacheManager``, single-flight included). Standard library only,
Python 3.9+.

Triton creates its cache folder at start and raises where it cannot: the hook makes it first,
or points ``TRITON_CACHE_DIR`` at a folder the process can use (``makes``: ``trust.unmade``).
"""

import hashlib
import json
import os
import sys

from ... import common
from ...common import keep, text, touch
from ...names import TRITON_MANAGER_VAR

KIND = "triton"


def part(hook):
    """The record's ``triton`` part of this process, made on first use."""
    return common.part(hook, KIND, {
        "hits": 0, "misses": 0, "compile_seconds": 0.0, "hit_keys": [], "missed": [],
        "kernels": [], "autotuned": [], "unrecorded": [],
        "dropped": {"hit_keys": 0, "missed": 0, "kernels": 0, "autotuned": 0}})


def section(hook):
    """The record's ``triton`` part at exit, with single-flight's and the tier's."""
    return common.section(hook, KIND)


def on_import(triton_module, hook):
    """Run right after ``import triton``."""
    hook.observed(KIND)
    stats = part(hook)
    tier = common.tier(hook)
    if hook.flight or tier is not None:
        try:
            _flight_triton(triton_module, hook, tier)
        except Exception as exc:  # the job runs as without single-flight and the tier
            common.wrappers_off(hook, KIND, tier, f"not installed: {exc!r}")
            hook.warn("triton cache manager", exc)
    if hook.folder:
        _triton_listener(triton_module, hook, stats)
        _autotune_recorder(hook, stats)


def _triton_listener(triton_module, hook, stats):
    # (getattr: Python's AttributeError on a module still being imported reads as a circular
    # import, and Triton < 3.4, e.g. 3.1 of jax 0.4.34's AlphaFold 3 images, has no knobs)
    knobs = getattr(getattr(triton_module, "knobs", None), "compilation", None)
    if knobs is None or not hasattr(knobs, "listener"):
        stats["unrecorded"].append(text(
            f"triton {_version('triton')} has no compilation listener (triton.knobs, Triton >= 3.4): "
            "its cache's hits, misses, compile times and kernel descriptions are not recorded "
            "(validate counts its misses from new entries; warm replays none of its kernels), "
            "and a hit does not mark its entry used for prune", 500))
        return
    previous = knobs.listener

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        try:
            folder = None
            for path in (metadata_group or {}).values():
                folder = os.path.dirname(path)
                break
            name = getattr(src, "name", None) or str(metadata.get("name", "?"))
            if cache_hit:
                stats["hits"] += 1
                if folder:
                    keep(stats, "hit_keys", text(os.path.basename(folder)))
                    touch(folder)
            else:
                stats["misses"] += 1
                keep(stats, "missed", {"name": text(name), "key": text(os.path.basename(folder or ""))})
                micros = getattr(times, "ir_initialization", 0) + getattr(times, "store_results", 0)
                micros += sum(d for _stage, d in getattr(times, "lowering_stages", []))
                stats["compile_seconds"] += micros / 1e6
                _keep_kernel(stats, src, metadata, os.path.basename(folder or ""))
        except Exception as exc:
            hook.warn("triton listener", exc)
        if previous is not None:
            previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times,
                     cache_hit=cache_hit)

    knobs.listener = listener


#: At most this many kernel descriptions per process, each at most KERNEL_BYTES of JSON and
#: all together at most KERNELS_BYTES; the rest are counted in ``dropped.kernels``. An FLA
#: process compiles about 40 kernels of 1-3 KiB each.
MAX_KERNELS = 200
KERNEL_BYTES = 16 << 10
KERNELS_BYTES = 512 << 10
_described = set()  # (field, digest) of what this process kept or dropped already
_kept_bytes = {"kernels": 0, "autotuned": 0}
_defaults = {}  # target -> the backend's default options


def _keep_kernel(stats, src, metadata, key):
    """Append a description of the kernel ``src`` just compiled to the record, once, within
    the bounds; one that cannot be described (no importable function, a constant of an odd
    type) is counted in ``dropped.kernels``."""
    try:
        kernel = describe(src, metadata, key)
    except Exception:  # a backend or value this hook does not know: only counted
        kernel = None
    _keep_bounded(stats, kernel, "kernels", (MAX_KERNELS, KERNEL_BYTES, KERNELS_BYTES))


def _keep_bounded(stats, item, field, limits):
    """Append the JSON-able ``item`` (None: not describable) to ``stats[field]`` once, within
    ``limits`` (items, bytes of one, bytes of all); the rest are counted in ``dropped``."""
    try:
        data = None if item is None else json.dumps(item, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):  # a value JSON cannot carry
        data = None
    if data is not None:
        digest = hashlib.sha256(data.encode()).digest()
        if (field, digest) in _described:
            return
        _described.add((field, digest))
    most, one, every = limits
    if (data is None or len(stats[field]) >= most or len(data) > one
            or _kept_bytes[field] + len(data) > every):
        stats["dropped"][field] += 1
        return
    _kept_bytes[field] += len(data)
    stats[field].append(item)


class _Odd(Exception):
    """A value the description cannot carry."""


def encode(value):
    """A JSON form of a kernel's constant, attribute, signature or option value that decodes to
    the same value (``str`` of it is part of Triton's key, so tuples stay tuples)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return {"float": repr(value)}
        return value
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, tuple):
        return {"tuple": [encode(v) for v in value]}
    names = {cls.__name__ for cls in type(value).__mro__}
    if "JITFunction" in names:
        return {"jit_function": f"{value.module}:{value.fn.__qualname__}"}
    if "constexpr" in names:
        return {"constexpr": encode(value.value)}
    if "dtype" in names:
        return {"dtype": str(value)}
    raise _Odd(type(value).__name__)


def _version(module):
    top = sys.modules.get(module.split(".", 1)[0])
    version = getattr(top, "__version__", None)
    return version if isinstance(version, str) else None


def _default_options(target):
    """The options the backend of ``target`` chooses when a launch sets none."""
    key = (target.backend, target.arch, target.warp_size)
    if key not in _defaults:
        from triton.compiler.compiler import make_backend

        _defaults[key] = dict(vars(make_backend(target).parse_options({})))
    return _defaults[key]


def describe(src, metadata, key=""):
    """What compiles the kernel ``src`` again without the job: the JIT function's module and
    qualname (with its package's version), the signature, constants and attributes Triton
    specialised it on, the options the launch set (those that differ from the backend's
    defaults, so that a newer Triton applies its own defaults to the rest) and the target.
    None for a kernel that cannot be compiled that way (an IR file, a function defined inside
    another, a constant of an odd type)."""
    fn = getattr(src, "fn", None)
    module, qualname = getattr(fn, "module", None), getattr(getattr(fn, "fn", None), "__qualname__", None)
    target = metadata.get("target")
    if not (isinstance(module, str) and isinstance(qualname, str) and "<" not in qualname
            and hasattr(src, "signature") and hasattr(target, "arch")):
        return None
    defaults = _default_options(target)
    try:
        return {
            "module": module, "qualname": qualname, "version": _version(module),
            "name": text(getattr(src, "name", qualname)),
            "signature": {str(k): encode(v) for k, v in src.signature.items()},
            "constants": [[list(k), encode(v)] for k, v in getattr(src, "constants", {}).items()],
            "attrs": [[list(k), encode(v)] for k, v in getattr(src, "attrs", {}).items()],
            "options": {k: encode(metadata[k]) for k in sorted(defaults)
                        if k in metadata and metadata[k] != defaults[k]},
            "target": {"backend": target.backend, "arch": encode(target.arch),
                       "warp_size": target.warp_size},
            "triton": metadata.get("triton_version"), "key": text(key, 100),
        }
    except (_Odd, TypeError, AttributeError):
        return None


#: At most this many autotune choices per process, each at most CHOICE_BYTES of JSON (a config
#: with its timings is some 200 bytes: over 150 configs fit) and all together at most
#: CHOICES_BYTES; the rest are counted in ``dropped.autotuned``.
MAX_CHOICES = 200
CHOICE_BYTES = 32 << 10
CHOICES_BYTES = 512 << 10
MAX_KEY_TEXT = 2000  # a longer tuning key (a key argument of an odd type) is not kept


def _autotune_recorder(hook, stats):
    """Keep each choice Triton's autotuner makes where it keeps its results on disk
    (``Autotuner.check_disk_cache``: with ``TRITON_CACHE_AUTOTUNING=1`` or
    ``autotune(cache_results=True)``, the same in Triton 3.4 to 3.9; 3.6 has no autotuning
    listener), so that the replay can write the result file into another cache (issue 26)."""
    from triton.runtime.autotuner import Autotuner

    original = getattr(Autotuner, "check_disk_cache", None)
    if original is None:  # Triton 3.1 keeps no autotuning results on disk: none to record
        stats["unrecorded"].append(text(f"triton {_version('triton')} keeps no autotuning results on "
                                        "disk (Autotuner.check_disk_cache): none recorded", 300))
        return

    def check_disk_cache(self, tuning_key, configs, bench_fn):
        found = original(self, tuning_key, configs, bench_fn)
        try:
            choice = autotune_choice(self, tuning_key, configs)
            _keep_bounded(stats, choice, "autotuned", (MAX_CHOICES, CHOICE_BYTES, CHOICES_BYTES))
        except Exception as exc:
            hook.warn("triton autotune record", exc)
        return found

    Autotuner.check_disk_cache = check_disk_cache


def autotune_choice(autotuner, tuning_key, configs):
    """What writes the autotuner's result file for ``tuning_key`` again: the JIT function (as
    in :func:`describe`) and its ``cache_key``, the target, the tuning key (its ``str`` is part
    of the file's key, its JSON is the file's ``key``), and each config Triton tried with its
    timings (the file's ``configs_timings``; their ``str`` is part of the key). None where
    Triton keeps no file (no key, a config with a ``pre_hook``) or it has no timings."""
    from triton.runtime.driver import driver

    key_text = str(tuning_key)
    if (not tuning_key or any(c.pre_hook for c in configs) or tuning_key not in autotuner.cache
            or len(key_text) > MAX_KEY_TEXT):
        return None
    timings = getattr(autotuner, "configs_timings", None) or {}
    if any(c not in timings for c in configs):
        return None
    fn = autotuner.fn
    while not hasattr(fn, "cache_key"):
        fn = fn.fn
    module, qualname = getattr(fn, "module", None), getattr(getattr(fn, "fn", None), "__qualname__", None)
    if not (isinstance(module, str) and isinstance(qualname, str) and "<" not in qualname):
        return None
    try:
        key = json.loads(json.dumps(tuning_key))
    except (TypeError, ValueError):  # Triton could not write this key either
        return None
    target = driver.active.get_current_target()
    return {
        "module": module, "qualname": qualname, "version": _version(module),
        "triton": getattr(sys.modules.get("triton"), "__version__", None), "cache_key": fn.cache_key,
        "target": {"backend": target.backend, "arch": encode(target.arch), "warp_size": target.warp_size},
        "key": key, "key_text": key_text,
        # a config that failed to compile is timed inf: encoded as in descriptions
        "configs_timings": [[dict(vars(c)), encode(timings[c])] for c in configs],
        "chosen": configs.index(autotuner.cache[tuning_key]),
    }


#: The Triton cache manager gpu-cache exports for a read-only cache root (``seed``, beside
#: this file, by the name Triton imports it with); it does single-flight too.
_SEED_MODULE = __name__ + ".seed"


def _flight_triton(triton_module, hook, tier):
    """Make Triton's cache manager gpu-cache's single-flight one, or the tier's (which does
    single-flight too), in this process only (the knob, not ``TRITON_CACHE_MANAGER``: a child
    without this folder on its path would fail to import it). A manager you named stays, and
    single-flight and the tier are off for Triton then (the record says so)."""
    flight = common.flight(hook) if hook.flight else None

    def off(why):
        if flight is not None:
            flight.disable(KIND, why)
        if tier is not None:
            tier.disable(KIND, why)

    cache_knobs = getattr(getattr(triton_module, "knobs", None), "cache", None)
    if cache_knobs is None or not any("manager_class" in vars(k) for k in type(cache_knobs).__mro__):
        off("this triton has no triton.knobs.cache.manager_class (< 3.4)")
        return
    theirs = os.environ.get(TRITON_MANAGER_VAR)
    if theirs:
        if theirs.split(":", 1)[0] != _SEED_MODULE:
            off(text(f"{TRITON_MANAGER_VAR}={theirs} is your own", 300))
        elif tier is not None:  # gpu-cache's seed manager (a read-only root): single-flight in it
            tier.disable(KIND, text(f"{TRITON_MANAGER_VAR}={theirs}", 300))
        return
    if tier is None:
        from .seed import FlightCacheManager as manager
    else:  # (the tier's manager builds on the seed's)
        from .tier_manager import TierCacheManager as manager
    cache_knobs.manager_class = manager
