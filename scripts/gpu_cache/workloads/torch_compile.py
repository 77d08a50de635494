"""Built-in workload ``torch-compile``: pre-norm transformer blocks under ``torch.compile``,
forward and backward.

``python -m gpu_cache.workloads.torch_compile --shape 64`` compiles one training step (the
blocks' forward, a loss, its backward) for sequence length 64 with Inductor and prints one
JSON line; ``--shape 32,64`` runs several lengths in one process (each a compile of its own:
``dynamic=False``). ``--blocks``, ``--d-model``, ``--heads`` and ``--batch`` size the model
(the defaults are what the H200 figures use, and small enough for a CPU). It runs on the first
GPU where torch sees one, else on the CPU (Inductor's C++ backend). Its graphs depend only on
these arguments and the software, so a second process with the same cache must hit every one.

Printed: the loss per length, ``first_call_seconds`` (compile and first step) and
``step_seconds`` (a second step at the same length) per length, and ``compile_seconds``: the
sum of their differences, the compile part of the process. ``--save-artifacts`` and
``--load-artifacts`` carry the process's graphs in torch's portable form (Mega-Cache), to
compare with carrying Inductor's folder (tests/benchmarks/torch_compile_gpu.py). Each length's
input is drawn from a generator seeded with the length, so the two steps compute the same;
where the workload runner asks for outputs (``$GPU_CACHE_OUTPUTS``, issue 40), both steps'
loss and gradients are reported (:mod:`gpu_cache.workloads.outputs`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from gpu_cache.workloads import outputs


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError(text)
    return value


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="torch-compile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", required=True,
                        help="sequence length(s): a positive integer, or several separated by commas")
    parser.add_argument("--blocks", default="4", help="transformer blocks (default 4)")
    parser.add_argument("--d-model", default="128", help="model width (default 128)")
    parser.add_argument("--heads", default="4", help="attention heads (default 4)")
    parser.add_argument("--batch", default="2", help="batch size (default 2)")
    parser.add_argument("--save-artifacts", metavar="FILE",
                        help="at the end, write torch's portable cache (Mega-Cache: "
                             "torch.compiler.save_cache_artifacts) of what this process compiled or loaded")
    parser.add_argument("--load-artifacts", metavar="FILE",
                        help="before the first compile, load a Mega-Cache FILE (a pickle: only one "
                             "you made yourself) into Inductor's cache folder")
    args = parser.parse_args(argv)
    try:
        args.shapes = [_positive(part) for part in args.shape.split(",")]
        args.blocks, args.d_model, args.heads, args.batch = (
            _positive(args.blocks), _positive(args.d_model), _positive(args.heads), _positive(args.batch))
        if args.d_model % args.heads:
            raise ValueError("--d-model must be a multiple of --heads")
    except ValueError as exc:
        parser.exit(2, f"torch-compile: error: sizes must be positive integers ({exc})\n")
    return args


def _model(torch, blocks: int, d_model: int, heads: int):
    nn = torch.nn
    functional = torch.nn.functional

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
            self.qkv, self.out = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
            self.up, self.down = nn.Linear(d_model, 4 * d_model), nn.Linear(4 * d_model, d_model)

        def forward(self, x):
            batch, seq, width = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(width, dim=-1)
            q, k, v = (t.view(batch, seq, heads, width // heads).transpose(1, 2) for t in (q, k, v))
            attended = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.out(attended.transpose(1, 2).reshape(batch, seq, width))
            return x + self.down(functional.gelu(self.up(self.ln2(x))))

    return nn.Sequential(*[Block() for _ in range(blocks)])


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    started = time.perf_counter()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    loaded = None
    if args.load_artifacts:
        begin = time.perf_counter()
        with open(args.load_artifacts, "rb") as stream:
            torch.compiler.load_cache_artifacts(stream.read())
        loaded = round(time.perf_counter() - begin, 3)
    torch.manual_seed(0)
    model = _model(torch, args.blocks, args.d_model, args.heads).to(device)
    compiled = torch.compile(model, dynamic=False)

    def step(length: int) -> tuple[float, dict]:
        model.zero_grad(set_to_none=True)
        seeded = torch.Generator(device=device).manual_seed(length)
        x = torch.randn(args.batch, length, args.d_model, device=device, generator=seeded)
        loss = compiled(x).float().pow(2).mean()
        loss.backward()
        if device == "cuda":
            torch.cuda.synchronize()
        found = {f"{length}/loss": loss} if outputs.wanted() else {}
        found.update({f"{length}/grad/{name}": p.grad for name, p in model.named_parameters()
                      if outputs.wanted() and p.grad is not None})
        return float(loss.detach()), found

    firsts, steps, losses, found, again = [], [], [], {}, {}
    for length in args.shapes:
        begin = time.perf_counter()
        value, first = step(length)
        firsts.append(round(time.perf_counter() - begin, 3))
        begin = time.perf_counter()
        second = step(length)[1]
        steps.append(round(time.perf_counter() - begin, 3))
        found.update(first)
        again.update(second)
        if value != value or value in (float("inf"), float("-inf")):
            print(f"torch-compile: error: loss is not finite ({value}) at length {length}", file=sys.stderr)
            return 1
        losses.append(round(value, 4))
    outputs.save(found, again)
    saved = None
    if args.save_artifacts:
        artifacts = torch.compiler.save_cache_artifacts()
        if artifacts is not None:
            with open(args.save_artifacts, "wb") as stream:
                stream.write(artifacts[0])
            saved = len(artifacts[0])
    print(json.dumps({
        "workload": "torch-compile", "shape": args.shape, "loss": losses,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__, "first_call_seconds": firsts, "step_seconds": steps,
        "compile_seconds": round(sum(max(0.0, f - s) for f, s in zip(firsts, steps)), 3),
        "seconds": round(time.perf_counter() - started, 3),
        "artifacts_saved_bytes": saved, "artifacts_load_seconds": loaded,
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
