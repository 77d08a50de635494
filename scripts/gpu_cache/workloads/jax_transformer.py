"""Built-in workload ``jax-transformer``: a few pre-norm transformer layers, forward and gradient.

``python -m gpu_cache.workloads.jax_transformer --shape 64`` compiles and runs one training
step (``value_and_grad`` of a loss over the layers) for sequence length 64 and prints one
JSON line. ``--shape 256,512,1024`` runs several lengths in one process; ``--layers``,
``--d-model``, ``--heads`` and ``--batch`` size the model (the defaults are small enough for a
CPU; the GPU benchmark uses a 12-layer model). Its compiled programs depend only on these
arguments, so a second process with the same cache must hit every one of them. Where the
workload runner asks for outputs (``$GPU_CACHE_OUTPUTS``, issue 40), it runs each step a
second time and reports the loss and every gradient of both runs
(:mod:`gpu_cache.workloads.outputs`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from gpu_cache.workloads import outputs

VOCAB = 512


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError(text)
    return value


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="jax-transformer", description=__doc__)
    parser.add_argument("--shape", required=True,
                        help="sequence length(s): a positive integer, or several separated by commas")
    parser.add_argument("--layers", default="4", help="transformer layers (default 4)")
    parser.add_argument("--d-model", default="128", help="model width (default 128)")
    parser.add_argument("--heads", default="4", help="attention heads (default 4)")
    parser.add_argument("--batch", default="2", help="batch size (default 2)")
    args = parser.parse_args(argv)
    try:
        args.shapes = [_positive(part) for part in args.shape.split(",")]
        args.layers, args.d_model, args.heads, args.batch = (
            _positive(args.layers), _positive(args.d_model), _positive(args.heads), _positive(args.batch))
        if args.d_model % args.heads:
            raise ValueError("--d-model must be a multiple of --heads")
    except ValueError as exc:
        parser.exit(2, f"jax-transformer: error: sizes must be positive integers ({exc})\n")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    started = time.perf_counter()
    import jax
    import jax.numpy as jnp

    LAYERS, D_MODEL, HEADS, BATCH = args.layers, args.d_model, args.heads, args.batch
    D_FF = 4 * D_MODEL

    def init(key):
        keys = jax.random.split(key, 2 + 4 * LAYERS)
        scale = D_MODEL ** -0.5
        params = {"embed": jax.random.normal(keys[0], (VOCAB, D_MODEL)) * scale, "layers": []}
        for i in range(LAYERS):
            k = keys[2 + 4 * i: 6 + 4 * i]
            params["layers"].append({
                "qkv": jax.random.normal(k[0], (D_MODEL, 3 * D_MODEL)) * scale,
                "out": jax.random.normal(k[1], (D_MODEL, D_MODEL)) * scale,
                "up": jax.random.normal(k[2], (D_MODEL, D_FF)) * scale,
                "down": jax.random.normal(k[3], (D_FF, D_MODEL)) * D_FF ** -0.5,
                "ln1": jnp.ones(D_MODEL), "ln2": jnp.ones(D_MODEL),
            })
        return params

    def layer_norm(x, gain):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return gain * (x - mean) * jax.lax.rsqrt(var + 1e-5)

    def attention(x, layer):
        batch, seq, _ = x.shape
        q, k, v = jnp.split(x @ layer["qkv"], 3, axis=-1)

        def heads(t):
            return t.reshape(batch, seq, HEADS, D_MODEL // HEADS).transpose(0, 2, 1, 3)

        q, k, v = heads(q), heads(k), heads(v)
        scores = q @ k.transpose(0, 1, 3, 2) / (D_MODEL // HEADS) ** 0.5
        mask = jnp.tril(jnp.ones((seq, seq), bool))
        weights = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
        return (weights @ v).transpose(0, 2, 1, 3).reshape(batch, seq, D_MODEL) @ layer["out"]

    def loss(params, tokens):
        x = params["embed"][tokens]
        for layer in params["layers"]:
            x = x + attention(layer_norm(x, layer["ln1"]), layer)
            x = x + jax.nn.gelu(layer_norm(x, layer["ln2"]) @ layer["up"]) @ layer["down"]
        logits = x @ params["embed"].T
        targets = jnp.roll(tokens, -1, axis=1)
        logp = jax.nn.log_softmax(logits)
        return -jnp.take_along_axis(logp, targets[..., None], axis=-1).mean()

    step = jax.jit(jax.value_and_grad(loss))
    params = jax.jit(init)(jax.random.PRNGKey(0))
    first_calls, losses, found, again = [], [], {}, {}
    for length in args.shapes:
        tokens = jax.random.randint(jax.random.PRNGKey(1), (BATCH, length), 0, VOCAB)
        first = time.perf_counter()
        value, grads = step(params, tokens)
        value.block_until_ready()
        first_calls.append(round(time.perf_counter() - first, 3))
        if not bool(jnp.isfinite(value)):
            print(f"jax-transformer: error: loss is not finite ({value}) at length {length}", file=sys.stderr)
            return 1
        losses.append(round(float(value), 4))
        if outputs.wanted():
            found.update(named(jax, length, value, grads))
            again.update(named(jax, length, *step(params, tokens)))
    outputs.save(found, again)
    print(json.dumps({
        "workload": "jax-transformer", "shape": args.shape, "loss": losses,
        "device": str(jax.devices()[0].device_kind), "first_call_seconds": first_calls,
        "seconds": round(time.perf_counter() - started, 3),
    }))
    return 0


def named(jax, length: int, value, grads) -> dict:
    """One step's outputs by name: its loss and each gradient, at sequence ``length``."""
    leaves = jax.tree_util.tree_leaves(grads)
    return {f"{length}/loss": value, **{f"{length}/grad{i}": leaf for i, leaf in enumerate(leaves)}}


if __name__ == "__main__":
    raise SystemExit(main())
