"""A jax-triton program for the ptxas benchmark (issue 34): one jit of ``--kernels`` matmul
kernels (each its own block sizes, so its own PTX), run in a fresh process.

    python tests/benchmarks/ptxas_jax_triton.py --kernels 6 --size 1024 [--lower-only]

jaxlib assembles each kernel's PTX with ptxas at the kernel's first launch, so the first call's
time holds those ptxas runs; the second call's does not. ``--lower-only`` (a machine without a
GPU) lowers for CUDA (compute capability 9.0) and launches nothing. Prints one JSON line:
``lower_seconds``, ``first_call_seconds``, ``second_call_seconds`` (null with --lower-only).
jax-triton passes outputs after the inputs and scalars, so the kernel takes ``c_ptr`` last.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import jax_triton as jt
import triton
import triton.language as tl

#: (BM, BN, BK, num_warps): each a kernel of its own.
CONFIGS = ((64, 64, 32, 4), (128, 64, 32, 4), (64, 128, 32, 4), (128, 128, 32, 8), (128, 128, 64, 8),
           (64, 64, 64, 4), (128, 64, 64, 4), (64, 128, 64, 4))


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        a = tl.load(a_ptr + rows[:, None] * K + ks[None, :])
        b = tl.load(b_ptr + ks[:, None] * N + cols[None, :])
        acc += tl.dot(a, b)
    tl.store(c_ptr + rows[:, None] * N + cols[None, :], acc.to(tl.float16))


def program(kernels: int, size: int, capability: int | None):
    def run(a, b):
        total = jnp.zeros((size, size), jnp.float16)
        for bm, bn, bk, warps in CONFIGS[:kernels]:
            total = total + jt.triton_call(
                a, b, kernel=matmul_kernel, out_shape=jax.ShapeDtypeStruct((size, size), jnp.float16),
                grid=(size // bm, size // bn), num_warps=warps, num_stages=3,
                compute_capability=capability, M=size, N=size, K=size, BM=bm, BN=bn, BK=bk)
        return total

    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kernels", type=int, default=6)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--lower-only", action="store_true")
    args = parser.parse_args()
    a = jnp.ones((args.size, args.size), jnp.float16)
    b = jnp.ones((args.size, args.size), jnp.float16)
    run = jax.jit(program(args.kernels, args.size, 90 if args.lower_only else None))
    started = time.perf_counter()
    if args.lower_only:
        run.trace(a, b).lower(lowering_platforms=("cuda",))
        print(json.dumps({"lower_seconds": round(time.perf_counter() - started, 3),
                          "first_call_seconds": None, "second_call_seconds": None}))
        return 0
    lowered = run.lower(a, b)
    lowered_at = time.perf_counter()
    compiled = lowered.compile()
    compiled_at = time.perf_counter()
    compiled(a, b).block_until_ready()
    first_at = time.perf_counter()
    compiled(a, b).block_until_ready()
    print(json.dumps({"lower_seconds": round(lowered_at - started, 3),
                      "compile_seconds": round(compiled_at - lowered_at, 3),
                      "first_call_seconds": round(first_at - compiled_at, 3),
                      "second_call_seconds": round(time.perf_counter() - first_at, 4)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
