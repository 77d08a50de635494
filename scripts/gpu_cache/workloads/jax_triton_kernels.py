"""Built-in workload ``jax-triton``: a JAX program whose matmuls and attention are Triton
kernels called through jax-triton, like AlphaFold 3 with ``--flash_attention_implementation=triton``.

``python -m gpu_cache.workloads.jax_triton_kernels --shape 256`` builds one attention block
for sequence length 256 (batch 2, width 128, 2 heads of 64): five tiled matmuls (the q, k, v
and output projections and a GELU up-projection, each at its own block sizes: five kernels)
and a flash-attention kernel, and prints one JSON line. jax-triton compiles these kernels while
JAX lowers the program, in every process: gpu-cache's startup hook keeps them
(``$GPU_CACHE_JAX_TRITON``), so a later process lowers at once.

* ``run`` mode (chosen when JAX sees a GPU): jit and run the program and check it against the
  same program in plain JAX (``--xla`` runs that one instead: the XLA twin of the benchmark).
* ``lower`` mode (chosen without a GPU): lower the program for CUDA only, for the compute
  capability of each target in ``--targets`` (default ``$GPU_CACHE_TRITON_TARGETS``, else
  sm_90). jax-triton's Triton compile really runs, and its kernels are kept for those GPUs: the
  same keys a GPU of that compute capability computes (the target, the Triton build and the
  Python version decide them; nothing of this machine does). Nothing is run, and JAX's own cache
  is not touched (JAX compiles only on a GPU).

``--kernels matmul`` leaves the attention out; ``--autotune`` adds a matmul with four
configurations for jaxlib to autotune at its first launch (issue 34's item 4). Where the
workload runner asks for outputs (``$GPU_CACHE_OUTPUTS``, issue 40): in ``run`` mode the
block's result, from a first call and a second one of the same compiled program; in ``lower``
mode the lowered module's text for each target, which holds every kernel's compiled code as
the cache served it or jax-triton compiled it (:mod:`gpu_cache.workloads.outputs`). Exit codes:
0 success, 1 a result that differs from plain JAX's, 2 bad arguments or no jax-triton.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time

import triton
import triton.language as tl

from gpu_cache.core import names
from gpu_cache.workloads import outputs

WORKLOAD = "jax-triton"
BATCH, WIDTH, HEADS = 2, 128, 2
HEAD = WIDTH // HEADS
#: Block sizes (rows, columns, depth) of the five matmuls: one kernel each.
MATMULS = {"q": (64, 64, 32), "k": (128, 64, 32), "v": (64, 128, 32), "out": (128, 128, 64),
           "up": (64, 128, 64)}
ATTENTION_BLOCKS = (64, 64)
_TARGET_RE = re.compile(r"sm_(\d{2,3})a?")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=WORKLOAD, description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", required=True, help="sequence length: a multiple of 128")
    parser.add_argument("--mode", choices=("auto", "run", "lower"), default="auto")
    parser.add_argument("--targets", default=None, help="lower mode: sm_80,sm_90,... (default sm_90)")
    parser.add_argument("--kernels", choices=("all", "matmul"), default="all")
    parser.add_argument("--autotune", action="store_true", help="add an autotuned matmul")
    parser.add_argument("--xla", action="store_true", help="run the plain-JAX twin instead")
    parser.add_argument("--module-out", help="write the lowered module's text to this file")
    args = parser.parse_args(argv)
    try:
        args.length = int(args.shape)
        if args.length <= 0 or args.length % 128:
            raise ValueError
    except ValueError:
        parser.exit(2, f"{WORKLOAD}: error: --shape must be a positive multiple of 128, not {args.shape!r}\n")
    targets = args.targets or os.environ.get(names.TRITON_TARGETS_VAR) or "sm_90"
    found = [_TARGET_RE.fullmatch(t.strip()) for t in targets.split(",") if t.strip()]
    if not found or not all(found):
        parser.exit(2, f"{WORKLOAD}: error: targets must look like sm_90, not {targets!r}\n")
    args.capabilities = sorted({int(m.group(1)) for m in found if m})
    return args


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GELU: tl.constexpr):
    """C = A @ B (row-major, sizes divisible by the blocks), fp32 accumulation, one C tile per
    program; GELU (tanh form) applied to the tile when asked. jax-triton passes the inputs,
    then the outputs."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    depth = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a_tile = tl.load(a_ptr + rows[:, None] * K + (k0 + depth)[None, :])
        b_tile = tl.load(b_ptr + (k0 + depth)[:, None] * N + cols[None, :])
        acc = tl.dot(a_tile, b_tile, acc)
    if GELU:
        inner = 0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)
        acc = 0.5 * acc * (1.0 + (2.0 / (1.0 + tl.exp(-2.0 * inner)) - 1.0))
    tl.store(c_ptr + rows[:, None] * N + cols[None, :], acc.to(c_ptr.dtype.element_ty))


@triton.jit
def attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, SEQ: tl.constexpr, DIM: tl.constexpr,
                     SCALE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_KV: tl.constexpr):
    """Softmax attention of one block of queries of one (batch, head) against all keys, in one
    pass over the key blocks with a running maximum and sum (flash attention's forward)."""
    rows = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    base = tl.program_id(1) * SEQ * DIM
    dims = tl.arange(0, DIM)
    q = tl.load(q_ptr + base + rows[:, None] * DIM + dims[None, :])
    best = tl.full((BLOCK_Q,), float("-inf"), tl.float32)
    total = tl.zeros((BLOCK_Q,), tl.float32)
    acc = tl.zeros((BLOCK_Q, DIM), tl.float32)
    for start in range(0, SEQ, BLOCK_KV):
        keys = start + tl.arange(0, BLOCK_KV)
        k = tl.load(k_ptr + base + keys[:, None] * DIM + dims[None, :])
        v = tl.load(v_ptr + base + keys[:, None] * DIM + dims[None, :])
        scores = tl.dot(q, tl.trans(k)) * SCALE
        new_best = tl.maximum(best, tl.max(scores, 1))
        weights = tl.exp(scores - new_best[:, None])
        shrink = tl.exp(best - new_best)
        total = total * shrink + tl.sum(weights, 1)
        acc = acc * shrink[:, None] + tl.dot(weights.to(v.dtype), v)
        best = new_best
    out = acc / total[:, None]
    tl.store(o_ptr + base + rows[:, None] * DIM + dims[None, :], out.to(o_ptr.dtype.element_ty))


#: The matmul with four configurations, which jaxlib benchmarks at the first launch.
tuned_matmul_kernel = triton.autotune(
    configs=[triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k}, num_warps=w)
             for m, n, k, w in ((64, 64, 32, 4), (128, 64, 32, 4), (64, 128, 64, 4), (128, 128, 32, 8))],
    key=["M", "N", "K"])(matmul_kernel)


def program(length: int, kernels: str = "all", autotune: bool = False, xla: bool = False,
            capability: int | None = None):
    """``(function, argument shapes)``: one attention block of sequence ``length``, its matmuls
    and attention through jax-triton (``xla``: in plain JAX). ``capability``: the compute
    capability jax-triton compiles for (None: the GPU's)."""
    import jax
    import jax.numpy as jnp

    rows = BATCH * length
    shapes = {"x": (rows, WIDTH), **dict.fromkeys(("q", "k", "v", "out"), (WIDTH, WIDTH)),
              "up": (WIDTH, 4 * WIDTH)}
    if xla:
        return _xla_program(length, kernels, autotune), shapes
    import jax_triton as jt

    def matmul(a, b, name, gelu=False):
        bm, bn, bk = MATMULS[name]
        m, k = a.shape
        n = b.shape[1]
        return jt.triton_call(a, b, kernel=matmul_kernel, out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
                              grid=(m // bm, n // bn), num_warps=4, num_stages=3,
                              compute_capability=capability, M=m, N=n, K=k, BLOCK_M=bm, BLOCK_N=bn,
                              BLOCK_K=bk, GELU=gelu)

    def attention(q, k, v):
        block_q, block_kv = ATTENTION_BLOCKS
        heads = [t.reshape(BATCH, length, HEADS, HEAD).transpose(0, 2, 1, 3) for t in (q, k, v)]
        shape = jax.ShapeDtypeStruct(heads[0].shape, q.dtype)
        out = jt.triton_call(*heads, kernel=attention_kernel, out_shape=shape,
                             grid=(length // block_q, BATCH * HEADS), num_warps=4, num_stages=2,
                             compute_capability=capability, SEQ=length, DIM=HEAD, SCALE=HEAD ** -0.5,
                             BLOCK_Q=block_q, BLOCK_KV=block_kv)
        return out.transpose(0, 2, 1, 3).reshape(rows, WIDTH)

    def block(x, wq, wk, wv, wo, wup):
        q, k, v = matmul(x, wq, "q"), matmul(x, wk, "k"), matmul(x, wv, "v")
        mixed = attention(q, k, v) if kernels == "all" else q + k + v
        y = x + matmul(mixed, wo, "out")
        hidden = matmul(y, wup, "up", gelu=True)
        if autotune:
            m, n = hidden.shape[0], WIDTH
            hidden = jt.triton_call(hidden[:, :WIDTH], wo, kernel=tuned_matmul_kernel,
                                    out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
                                    grid=lambda meta: (m // meta["BLOCK_M"], n // meta["BLOCK_N"]),
                                    compute_capability=capability, M=m, N=n, K=WIDTH, GELU=False)
        return jnp.concatenate([y, hidden[:, :WIDTH]], axis=1)

    return block, shapes


def _xla_program(length: int, kernels: str, autotune: bool):
    """The same block in plain JAX: the reference a run is checked against, and the XLA twin."""
    import jax
    import jax.numpy as jnp

    rows = BATCH * length

    def attention(q, k, v):
        heads = [t.reshape(BATCH, length, HEADS, HEAD).transpose(0, 2, 1, 3).astype(jnp.float32)
                 for t in (q, k, v)]
        weights = jax.nn.softmax(heads[0] @ heads[1].transpose(0, 1, 3, 2) * HEAD ** -0.5, axis=-1)
        out = (weights @ heads[2]).astype(q.dtype)
        return out.transpose(0, 2, 1, 3).reshape(rows, WIDTH)

    def matmul(a, b, gelu=False):
        out = jnp.dot(a, b, preferred_element_type=jnp.float32)
        return (jax.nn.gelu(out, approximate=True) if gelu else out).astype(a.dtype)

    def block(x, wq, wk, wv, wo, wup):
        q, k, v = matmul(x, wq), matmul(x, wk), matmul(x, wv)
        mixed = attention(q, k, v) if kernels == "all" else q + k + v
        y = x + matmul(mixed, wo)
        hidden = matmul(y, wup, gelu=True)
        if autotune:
            hidden = matmul(hidden[:, :WIDTH], wo)
        return jnp.concatenate([y, hidden[:, :WIDTH]], axis=1)

    return block


def lower(args: argparse.Namespace) -> dict:
    """Lower the program for CUDA at each compute capability: jax-triton compiles its kernels."""
    import jax
    import jax.numpy as jnp

    out = {"lower_seconds": [], "module_sha256": []}
    modules = {}
    for capability in args.capabilities:
        function, shapes = program(args.length, args.kernels, args.autotune, args.xla, capability)
        specs = [jax.ShapeDtypeStruct(shape, jnp.float16) for shape in shapes.values()]
        started = time.perf_counter()
        text = jax.jit(function).trace(*specs).lower(lowering_platforms=("cuda",)).as_text()
        out["lower_seconds"].append(round(time.perf_counter() - started, 3))
        out["module_sha256"].append(_module(text, args.module_out))
        modules[f"sm_{capability}/module"] = text.encode()
    out["targets"] = [f"sm_{c}" for c in args.capabilities]
    outputs.save(modules)
    return out


def _module(text: str, path: str | None) -> str:
    """The lowered module's sha256 (its text written to ``path`` too, appended)."""
    if path:
        with open(path, "a") as out:
            out.write(text)
    return hashlib.sha256(text.encode()).hexdigest()


def run(args: argparse.Namespace) -> tuple[dict, bool]:
    """Jit and run the program on the GPU; whether it agrees with plain JAX's."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    function, shapes = program(args.length, args.kernels, args.autotune, args.xla)
    keys = jax.random.split(jax.random.PRNGKey(0), len(shapes))
    values = [(jax.random.normal(key, shape, jnp.float32) * (1.0 if name == "x" else WIDTH ** -0.5)
               ).astype(jnp.float16) for key, (name, shape) in zip(keys, shapes.items())]
    started = time.perf_counter()
    lowered = jax.jit(function).trace(*values).lower()
    lowered_at = time.perf_counter()
    compiled = lowered.compile()
    compiled_at = time.perf_counter()
    result = compiled(*values)
    result.block_until_ready()
    first = time.perf_counter()
    again = compiled(*values)
    again.block_until_ready()
    outputs.save({"block": result}, {"block": again})
    out = {"lower_seconds": [round(lowered_at - started, 3)],
           "compile_seconds": round(compiled_at - lowered_at, 3),
           "first_launch_seconds": round(first - compiled_at, 3),
           "first_call_seconds": round(first - started, 3),
           "second_call_seconds": round(time.perf_counter() - first, 4),
           "module_sha256": [_module(lowered.as_text(), args.module_out)]}
    if args.xla:
        return out, True
    reference, _ = program(args.length, args.kernels, args.autotune, xla=True)
    expected = np.asarray(jax.jit(reference)(*values), np.float32)
    error = float(np.max(np.abs(np.asarray(result, np.float32) - expected)))
    out["max_abs_error"] = round(error, 5)
    return out, error <= 0.05 * max(1.0, float(np.max(np.abs(expected))))


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    started = time.perf_counter()
    try:
        import jax

        if not args.xla:
            import jax_triton  # noqa: F401  (its GPU support is checked on import)
    except ImportError as exc:
        print(f"{WORKLOAD}: error: {exc} (the jax-triton workload needs jax, triton and "
              "jax-triton with jaxlib's CUDA plugin)", file=sys.stderr)
        return 2
    gpu = any(d.platform == "gpu" for d in jax.devices())
    mode = args.mode if args.mode != "auto" else ("run" if gpu else "lower")
    if mode == "run" and not gpu:
        print(f"{WORKLOAD}: error: --mode run needs a GPU that JAX sees", file=sys.stderr)
        return 2
    ok = True
    if mode == "lower":
        figures = lower(args)
    else:
        figures, ok = run(args)
    kernels = len(MATMULS) + (args.kernels == "all") + (4 if args.autotune else 0)
    print(json.dumps({"workload": WORKLOAD, "shape": args.length, "mode": mode, "xla": args.xla,
                      "kernels": 0 if args.xla else kernels, "device": str(jax.devices()[0].device_kind),
                      **figures, "seconds": round(time.perf_counter() - started, 3)}))
    if not ok:
        print(f"{WORKLOAD}: error: the Triton kernels' result differs from plain JAX's "
              f"(max abs error {figures.get('max_abs_error')})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
