"""Built-in workload ``triton-kernels``: a handful of real Triton kernels for one problem size.

Run it as::

    TRITON_CACHE_DIR=/abs/cache python -m gpu_cache.workloads.triton_kernels --shape 1024 \
        [--targets sm_80,sm_90] [--mode auto|jit|aot]

It compiles a vector add, a row softmax and a tiled matmul at three block-size configurations,
all specialised for the problem size ``N`` (``--shape``), into ``TRITON_CACHE_DIR``, and prints one
JSON line (see :func:`summary_json`).

* ``jit`` mode (chosen automatically when PyTorch sees a CUDA GPU) launches every kernel the way a
  real job does, ``kernel[grid](...)`` on real tensors, and checks each result against a PyTorch
  reference. Triton compiles (or loads from the cache) on that first launch.
* ``aot`` mode (chosen automatically without a GPU) compiles ahead of time, with the Triton wheel's
  own ``ptxas``, for every target in ``--targets`` (default: the environment variable
  ``GPU_CACHE_TRITON_TARGETS``, else ``sm_90``). Nothing is launched.

Why the keys written in ``aot`` mode are exactly the keys a ``jit`` run computes on a GPU of that
compute capability: both modes go through one call site, :func:`_invoke`, which hands the same
Python arguments, built by the same :class:`KernelCase.make_args` from the same shapes, to
``JITFunction.run`` (``kernel[grid](...)`` is ``run(..., warmup=False)`` and ``kernel.warmup(...)``
is ``run(..., warmup=True)``; ``warmup`` is not part of any key). Triton itself then derives the
signature, the divisibility/``==1`` specialisation of every argument, the constexprs, and the
options (``num_warps``, ``num_stages`` and the target-dependent defaults) with its own binder and
backend, exactly as it does for a launch. The only differences are (a) tensors: in ``aot`` mode they
are Triton's own ``MockTensor`` placeholders with the same dtype and shape, whose ``data_ptr()`` is 0
(16-byte aligned, like every PyTorch CUDA allocation, which is at least 256-byte aligned) and whose
``stride()`` is the row-major stride of a contiguous tensor; and (b) the driver: in ``aot`` mode a
target-only stand-in (:class:`TargetOnlyDriver`) reports ``GPUTarget("cuda", cc, 32)``, which is
what Triton's CUDA driver reports for a GPU of compute capability ``cc``. Neither the kernel's file
path nor the module name is part of Triton's key (source text, starting line, used globals are), so
the location of this package does not matter either. What must still match between warm and run:
the Triton build, the Python version, and the set of cache-invalidating ``TRITON_*`` variables.
Where the workload runner asks for outputs (``$GPU_CACHE_OUTPUTS``, issue 40): in ``jit`` mode
each case's output tensor, from a first launch and a second one on the same inputs; in ``aot``
mode, where nothing runs, each kernel's cubin as the cache served it or Triton compiled it,
which is what a GPU would run (:mod:`gpu_cache.workloads.outputs`).
Exit codes: 0 success, 1 compile/launch/check failure, 2 bad arguments or environment.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver as _triton_driver
from triton.runtime.jit import JITFunction, MockTensor

from gpu_cache.core import names
from gpu_cache.core.errors import UsageError
from gpu_cache.workloads import outputs

WORKLOAD = "triton-kernels"
DEFAULT_TARGET = "sm_90"
SHAPE_MIN = 1
SHAPE_MAX = 16384
SOFTMAX_ROWS = 64
_TARGET_RE = re.compile(r"^sm_(\d{2,3})$")
# Fake device ids used in aot mode: far away from real CUDA ordinals, so that a later real launch in
# the same process never reuses a binder that Triton cached for a fake target.
_FAKE_DEVICE_BASE = 100_000


class WorkloadError(RuntimeError):
    """A compile, launch or result check failed; the CLI prints it as one line and exits 1."""


# --------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------


@triton.jit
def vector_add_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    """out[i] = x[i] + y[i] for i < n_elements; one program per BLOCK elements."""
    start = tl.program_id(0) * BLOCK
    idx = start + tl.arange(0, BLOCK)
    inside = idx < n_elements
    lhs = tl.load(x_ptr + idx, mask=inside)
    rhs = tl.load(y_ptr + idx, mask=inside)
    tl.store(out_ptr + idx, lhs + rhs, mask=inside)


@triton.jit
def row_softmax_kernel(in_ptr, out_ptr, in_row_stride, out_row_stride, n_cols, BLOCK_COLS: tl.constexpr):
    """Numerically stable softmax of one row per program; BLOCK_COLS >= n_cols."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_COLS)
    inside = cols < n_cols
    vals = tl.load(in_ptr + row * in_row_stride + cols, mask=inside, other=-float("inf"))
    shifted = vals - tl.max(vals, axis=0)
    num = tl.exp(shifted)
    tl.store(out_ptr + row * out_row_stride + cols, num / tl.sum(num, axis=0), mask=inside)


@triton.jit
def tiled_matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, s_am, s_ak, s_bk, s_bn, s_cm, s_cn,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """C = A @ B for fp16 A (MxK) and B (KxN), fp32 accumulation, one C tile per program."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    depth = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + depth
        a_tile = tl.load(a_ptr + rows[:, None] * s_am + ks[None, :] * s_ak,
                         mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        b_tile = tl.load(b_ptr + ks[:, None] * s_bk + cols[None, :] * s_bn,
                         mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc = tl.dot(a_tile, b_tile, acc)
    tl.store(c_ptr + rows[:, None] * s_cm + cols[None, :] * s_cn, acc.to(tl.float16),
             mask=(rows[:, None] < M) & (cols[None, :] < N))


# --------------------------------------------------------------------------------------------
# Cases: one kernel specialisation each, described once for both modes
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorSpec:
    """A tensor argument: name, shape and dtype name (``float16`` or ``float32``)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    is_input: bool


@dataclass(frozen=True)
class KernelCase:
    """One kernel specialisation of the workload.

    ``make_args`` turns the tensors (real PyTorch tensors or Triton ``MockTensor`` placeholders,
    keyed by :attr:`TensorSpec.name`) into the positional arguments of the kernel; ``options`` are
    the keyword arguments (constexprs, ``num_warps``, ``num_stages``); ``reference`` computes the
    expected output from real PyTorch tensors (jit mode only).
    """

    name: str
    kernel: JITFunction
    grid: tuple[int, ...]
    tensors: tuple[TensorSpec, ...]
    make_args: Callable[[Mapping[str, Any]], tuple[Any, ...]]
    options: Mapping[str, int]
    output: str
    reference: Callable[[Mapping[str, Any]], Any]
    tolerance: float = 0.0


def _strides(tensor: Any) -> tuple[int, ...]:
    """Strides of a PyTorch tensor or a MockTensor (both answer ``stride()`` with a tuple)."""
    return tuple(tensor.stride())


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _softmax_warps(block: int) -> int:
    return 4 if block <= 2048 else 8 if block <= 4096 else 16


MATMUL_CONFIGS: tuple[tuple[int, int, int, int, int], ...] = (
    # BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages
    (64, 64, 32, 4, 3),
    (128, 128, 32, 8, 3),
    (128, 64, 64, 4, 4),
)


def build_cases(n: int) -> list[KernelCase]:
    """Return the workload's kernel cases for problem size ``n``.

    Raises:
        UsageError: ``n`` is outside ``[SHAPE_MIN, SHAPE_MAX]``.
    """
    if not SHAPE_MIN <= n <= SHAPE_MAX:
        raise UsageError(f"--shape must be between {SHAPE_MIN} and {SHAPE_MAX}, got {n}")
    cases = [
        KernelCase(
            name="vector_add",
            kernel=vector_add_kernel,
            grid=(_cdiv(n, 1024),),
            tensors=(TensorSpec("x", (n,), "float32", True), TensorSpec("y", (n,), "float32", True),
                     TensorSpec("out", (n,), "float32", False)),
            make_args=lambda t: (t["x"], t["y"], t["out"], n),
            options={"BLOCK": 1024, "num_warps": 4, "num_stages": 2},
            output="out",
            reference=lambda t: t["x"] + t["y"],
        )
    ]
    block_cols = triton.next_power_of_2(n)
    cases.append(KernelCase(
        name="row_softmax",
        kernel=row_softmax_kernel,
        grid=(SOFTMAX_ROWS,),
        tensors=(TensorSpec("x", (SOFTMAX_ROWS, n), "float32", True),
                 TensorSpec("out", (SOFTMAX_ROWS, n), "float32", False)),
        make_args=lambda t: (t["x"], t["out"], _strides(t["x"])[0], _strides(t["out"])[0], n),
        options={"BLOCK_COLS": block_cols, "num_warps": _softmax_warps(block_cols), "num_stages": 2},
        output="out",
        reference=lambda t: t["x"].softmax(dim=1),
        tolerance=1e-5,
    ))
    for bm, bn, bk, warps, stages in MATMUL_CONFIGS:
        cases.append(KernelCase(
            name=f"matmul_{bm}x{bn}x{bk}",
            kernel=tiled_matmul_kernel,
            grid=(_cdiv(n, bm), _cdiv(n, bn)),
            tensors=(TensorSpec("a", (n, n), "float16", True), TensorSpec("b", (n, n), "float16", True),
                     TensorSpec("c", (n, n), "float16", False)),
            make_args=lambda t: (t["a"], t["b"], t["c"], n, n, n,
                                 *_strides(t["a"]), *_strides(t["b"]), *_strides(t["c"])),
            options={"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps, "num_stages": stages},
            output="c",
            reference=lambda t: (t["a"].float() @ t["b"].float()),
            tolerance=2e-2,
        ))
    return cases


def _invoke(case: KernelCase, tensors: Mapping[str, Any], launch: bool) -> Any:
    """The single call site of both modes (see the module docstring for why this fixes the keys).

    ``launch=True`` is the JIT path of a real job, ``kernel[grid](*args, **options)``;
    ``launch=False`` is ``kernel.warmup(*args, grid=grid, **options)``. Both are
    ``JITFunction.run(*args, grid=grid, warmup=not launch, **options)`` with identical arguments.
    Returns the compiled kernel.
    """
    args = case.make_args(tensors)
    if launch:
        return case.kernel[case.grid](*args, **case.options)
    return case.kernel.warmup(*args, grid=case.grid, **case.options)


# --------------------------------------------------------------------------------------------
# Recording cache hits and misses
# --------------------------------------------------------------------------------------------


@dataclass
class KernelEvent:
    """What happened to one case on one target: cache hit or compile, and first-call seconds."""

    case: str
    kernel: str
    target: str
    cache_hit: bool | None = None
    seconds: float = 0.0


@dataclass
class _Recorder:
    """Chains onto ``triton.knobs.compilation.listener`` and attributes each call to a case."""

    events: list[KernelEvent] = field(default_factory=list)
    current: KernelEvent | None = None

    def __call__(self, *, src: Any, metadata: Any, metadata_group: Any, times: Any, cache_hit: bool) -> None:
        if self.current is not None:
            self.current.cache_hit = bool(cache_hit)

    @contextlib.contextmanager
    def installed(self) -> Iterator[_Recorder]:
        previous = triton.knobs.compilation.listener

        def chained(**kwargs: Any) -> None:
            self(**kwargs)
            if previous is not None:
                previous(**kwargs)

        triton.knobs.compilation.listener = chained
        try:
            yield self
        finally:
            triton.knobs.compilation.listener = previous


# --------------------------------------------------------------------------------------------
# aot mode: a target-only driver
# --------------------------------------------------------------------------------------------


def parse_target(text: str) -> int:
    """Parse ``sm_90`` into the compute capability 90.

    Raises:
        UsageError: the text is not of the form ``sm_<2-3 digits>``.
    """
    match = _TARGET_RE.match(text.strip())
    if match is None:
        raise UsageError(f"bad target {text!r}: expected sm_<compute capability>, e.g. sm_80 or sm_90")
    return int(match.group(1))


def parse_targets(text: str) -> list[int]:
    """Parse a comma-separated target list (``sm_80,sm_90``) into unique capabilities, in order.

    Raises:
        UsageError: the list is empty or an item is malformed.
    """
    items = [item for item in (part.strip() for part in text.split(",")) if item]
    if not items:
        raise UsageError("empty target list: expected e.g. sm_90 or sm_80,sm_90")
    caps: list[int] = []
    for item in items:
        cap = parse_target(item)
        if cap not in caps:
            caps.append(cap)
    return caps


class TargetOnlyDriver:
    """Stands in for Triton's CUDA driver on a machine without a GPU.

    It answers only what ``JITFunction.run(..., warmup=True)`` and ``triton.compile`` ask of a driver
    before a launch: the current target, device and stream. The target is exactly what Triton's
    CUDA driver reports for a real GPU of that compute capability, ``GPUTarget("cuda", cc, 32)``.
    Each target gets its own fake device id, because Triton caches the target per device in each
    kernel's binder. Anything that needs a real GPU (``utils``: loading a binary, device properties)
    raises ``RuntimeError``.
    """

    def __init__(self, capabilities: Sequence[int]) -> None:
        self._targets = {_FAKE_DEVICE_BASE + cap: GPUTarget("cuda", cap, 32) for cap in capabilities}
        self._device = _FAKE_DEVICE_BASE + capabilities[0]

    def select(self, capability: int) -> None:
        """Make ``capability`` the current target."""
        self._device = _FAKE_DEVICE_BASE + capability

    def is_active(self) -> bool:
        return False

    def get_current_target(self) -> GPUTarget:
        return self._targets[self._device]

    def get_current_device(self) -> int:
        return self._device

    def set_current_device(self, device: int) -> None:
        self._device = device

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    @property
    def utils(self) -> NoReturn:
        raise RuntimeError("no GPU: the ahead-of-time driver can compile but not load or launch kernels")

    def get_active_torch_device(self) -> NoReturn:
        raise RuntimeError("no GPU: the ahead-of-time driver has no torch device")


@contextlib.contextmanager
def target_only_driver(capabilities: Sequence[int]) -> Iterator[TargetOnlyDriver]:
    """Make a :class:`TargetOnlyDriver` Triton's active driver for the duration of the block."""
    previous = getattr(_triton_driver, "_active", None)
    fake = TargetOnlyDriver(capabilities)
    _triton_driver.set_active(fake)
    try:
        yield fake
    finally:
        _triton_driver.set_active(previous)


def _mock_tensors(case: KernelCase) -> dict[str, Any]:
    """Triton ``MockTensor`` placeholders with the dtype and shape of each tensor of ``case``."""
    return {spec.name: MockTensor(getattr(tl, spec.dtype), list(spec.shape)) for spec in case.tensors}


def run_aot(shape: int, capabilities: Sequence[int]) -> list[KernelEvent]:
    """Compile every case for every target ahead of time into ``TRITON_CACHE_DIR``.

    Raises:
        UsageError: bad shape.
        WorkloadError: a compile failed (the message names the case and target).
    """
    cases = build_cases(shape)
    recorder = _Recorder()
    binaries: dict[str, bytes] = {}
    with target_only_driver(capabilities) as fake, recorder.installed():
        for cap in capabilities:
            fake.select(cap)
            for case in cases:
                event = KernelEvent(case.name, case.kernel.__name__, f"sm_{cap}")
                recorder.events.append(event)
                recorder.current = event
                start = time.perf_counter()
                try:
                    compiled = _invoke(case, _mock_tensors(case), launch=False)
                    binaries[f"sm_{cap}/{case.name}"] = compiled.asm.get("cubin", b"")
                except Exception as exc:
                    raise WorkloadError(f"compiling {case.name} for sm_{cap} failed: {type(exc).__name__}: "
                                        f"{last_line(exc)}") from exc
                event.seconds = time.perf_counter() - start
    outputs.save(binaries)
    return recorder.events


# --------------------------------------------------------------------------------------------
# jit mode: real launches on a GPU
# --------------------------------------------------------------------------------------------


def gpu_available() -> bool:
    """True when PyTorch is importable and sees a CUDA GPU."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available()) and getattr(torch.version, "hip", None) is None


def _torch_tensors(case: KernelCase, generator: Any) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {}
    for spec in case.tensors:
        dtype = getattr(torch, spec.dtype)
        if spec.is_input:
            out[spec.name] = torch.randn(spec.shape, generator=generator, device="cuda", dtype=dtype)
        else:
            out[spec.name] = torch.empty(spec.shape, device="cuda", dtype=dtype)
    return out


def _check(case: KernelCase, tensors: Mapping[str, Any]) -> None:
    import torch

    got = tensors[case.output].float()
    want = case.reference(tensors).float()
    err = float((got - want).abs().max()) if got.numel() else 0.0
    bound = case.tolerance * max(1.0, float(want.abs().max()) if want.numel() else 0.0)
    if not torch.isfinite(got).all() or err > bound:
        raise WorkloadError(f"{case.name}: result differs from the reference "
                            f"(max abs error {err:g} > {bound:g})")


def run_jit(shape: int) -> tuple[str, list[KernelEvent]]:
    """Launch every case on the current GPU through ``kernel[grid](...)`` and check the results.

    Returns the GPU's target (``sm_90``) and one event per case, whose ``seconds`` is the first
    call (cache lookup or compile, load and launch) until the GPU has finished.

    Raises:
        UsageError: bad shape.
        WorkloadError: a compile, launch or result check failed.
    """
    import torch

    cases = build_cases(shape)
    major, minor = torch.cuda.get_device_capability()
    target = f"sm_{major * 10 + minor}"
    generator = torch.Generator(device="cuda").manual_seed(0)
    recorder = _Recorder()
    found, again = {}, {}
    with recorder.installed():
        for case in cases:
            tensors = _torch_tensors(case, generator)
            torch.cuda.synchronize()
            event = KernelEvent(case.name, case.kernel.__name__, target)
            recorder.events.append(event)
            recorder.current = event
            start = time.perf_counter()
            try:
                _invoke(case, tensors, launch=True)
                torch.cuda.synchronize()
            except Exception as exc:
                raise WorkloadError(f"{case.name} on {target} failed: {type(exc).__name__}: {exc}") from exc
            event.seconds = time.perf_counter() - start
            _check(case, tensors)
            if outputs.wanted():
                found[case.name] = tensors[case.output].clone()
                _invoke(case, tensors, launch=True)  # the same compiled kernel, the same inputs
                torch.cuda.synchronize()
                again[case.name] = tensors[case.output]
    outputs.save(found, again)
    return target, recorder.events


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def require_cache_dir(environ: Mapping[str, str]) -> str:
    """Return ``TRITON_CACHE_DIR`` as an absolute path.

    Raises:
        UsageError: it is unset or empty (Triton would otherwise write to ``~/.triton``).
    """
    value = environ.get(names.TRITON_CACHE_DIR_VAR, "")
    if not value.strip():
        raise UsageError("TRITON_CACHE_DIR is not set: export an absolute cache directory "
                         "(refusing to fall back to ~/.triton)")
    return os.path.abspath(value)


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def last_line(exc: BaseException) -> str:
    """The last non-empty line of an exception's message (compilers print long logs)."""
    text = str(exc).strip()
    return text.splitlines()[-1] if text else ""


def _parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="python -m gpu_cache.workloads.triton_kernels",
                            description="Compile (and on a GPU run) the built-in Triton workload "
                                        "for one shape.")
    parser.add_argument("--shape", type=int, required=True, help=f"problem size N ({SHAPE_MIN}..{SHAPE_MAX})")
    parser.add_argument("--targets", default=None,
                        help=f"aot targets, e.g. sm_80,sm_90 "
                             f"(default: ${names.TRITON_TARGETS_VAR}, else {DEFAULT_TARGET})")
    parser.add_argument("--mode", choices=("auto", "jit", "aot"), default="auto",
                        help="jit: launch on the GPU; aot: compile only; auto: jit if a GPU is visible")
    return parser


def summary_json(shape: int, mode: str, targets: Sequence[str], events: Sequence[KernelEvent],
                 seconds: float, cache_dir: str) -> str:
    """The one-line JSON summary printed on stdout."""
    return json.dumps({
        "workload": WORKLOAD,
        "shape": shape,
        "mode": mode,
        "targets": list(targets),
        "kernels": len(events),
        "seconds": round(seconds, 4),
        "hits": sum(1 for e in events if e.cache_hit is True),
        "misses": sum(1 for e in events if e.cache_hit is False),
        "cache_dir": cache_dir,
        "triton": triton.__version__,
        "python": "{}.{}".format(*sys.version_info[:2]),
        "events": [{"case": e.case, "kernel": e.kernel, "target": e.target, "cache_hit": e.cache_hit,
                    "seconds": round(e.seconds, 4)} for e in events],
    })


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit code (0 ok, 1 workload failure, 2 bad arguments)."""
    try:
        args = _parser().parse_args(argv)
        cache_dir = require_cache_dir(os.environ)
        build_cases(args.shape)  # validates the shape before any work
        mode = args.mode
        if mode == "auto":
            mode = "jit" if gpu_available() else "aot"
        elif mode == "jit" and not gpu_available():
            raise UsageError("--mode jit needs a CUDA GPU visible to PyTorch, and none is")
        targets_text = args.targets or os.environ.get(names.TRITON_TARGETS_VAR, "").strip() or DEFAULT_TARGET
        capabilities = parse_targets(targets_text)
    except UsageError as exc:
        print(f"triton-kernels: error: {exc}", file=sys.stderr)
        return 2
    try:
        os.makedirs(cache_dir, exist_ok=True)
        os.environ[names.TRITON_CACHE_DIR_VAR] = cache_dir  # absolute, so manifests name absolute paths
        start = time.perf_counter()
        if mode == "jit":
            target, events = run_jit(args.shape)
            targets = [target]
        else:
            events = run_aot(args.shape, capabilities)
            targets = [f"sm_{cap}" for cap in capabilities]
        seconds = time.perf_counter() - start
    except (WorkloadError, OSError) as exc:
        print(f"triton-kernels: error: {exc}", file=sys.stderr)
        return 1
    print(summary_json(args.shape, mode, targets, events, seconds, cache_dir), flush=True)
    return 0


if __name__ == "__main__":
    # Run the copy of this module imported under its package name, so that a job that imports
    # ``gpu_cache.workloads.triton_kernels`` and this CLI use the very same kernel objects.
    from gpu_cache.workloads.triton_kernels import main as _main

    sys.exit(_main())
