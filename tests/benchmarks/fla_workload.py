"""A real Triton library workload: flash-linear-attention's chunk_gated_delta_rule, forward
and backward, at one sequence length. Prints one JSON line with the first call's seconds.

    python tests/benchmarks/fla_workload.py --tokens 2048

Needs a CUDA GPU, torch, einops and fla-core (the benchmark carries fla-core as a wheel).
"""

from __future__ import annotations

import argparse
import json
import time

BATCH, HEADS, HEAD_DIM = 2, 8, 128


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=2048)
    args = parser.parse_args()
    started = time.perf_counter()
    import torch
    import torch.nn.functional as F
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    torch.manual_seed(0)
    shape = (BATCH, args.tokens, HEADS, HEAD_DIM)
    options = {"device": "cuda", "dtype": torch.bfloat16, "requires_grad": True}
    q = torch.randn(shape, **options)
    k = F.normalize(torch.randn(shape, device="cuda", dtype=torch.float32), p=2, dim=-1).to(torch.bfloat16)
    k.requires_grad_(True)
    v = torch.randn(shape, **options)
    g = F.logsigmoid(torch.randn(shape[:3], device="cuda", dtype=torch.float32)).requires_grad_(True)
    beta = torch.rand(shape[:3], device="cuda", dtype=torch.float32).sigmoid().requires_grad_(True)
    imported = time.perf_counter()
    output, _state = chunk_gated_delta_rule(q, k, v, g, beta)
    output.float().sum().backward()
    torch.cuda.synchronize()
    first_call = time.perf_counter() - imported
    again = time.perf_counter()
    output, _state = chunk_gated_delta_rule(q, k, v, g, beta)
    output.float().sum().backward()
    torch.cuda.synchronize()
    print(json.dumps({
        "workload": "fla-chunk-gated-delta-rule", "tokens": args.tokens,
        "first_call_seconds": round(first_call, 3),
        "second_call_seconds": round(time.perf_counter() - again, 4),
        "finite": bool(torch.isfinite(output).all()),
        "seconds": round(time.perf_counter() - started, 3),
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
