"""A stand-in for AlphaPulldown's run_structure_prediction.py: a tiny JAX "model" over the
fold's residues, padded to a token bucket (AlphaFold 3 compiles one program per bucket).
It runs inside the prediction container (Python 3.9 and jax 0.4.30 in the tests).

    python3 run_structure_prediction.py --input A+B --output_directory DIR \\
        --data_directory DATA [--buckets 32,64] [--jax_compilation_cache_dir DIR]
    python3 run_structure_prediction.py --tokens 64      # one bucket: gpu-cache's warm workload

Like AlphaPulldown, it applies --jax_compilation_cache_dir with jax.config.update, over the
environment's JAX_COMPILATION_CACHE_DIR. Writes DIR/ranking_debug.json: the fold, the bucket,
what the persistent cache did in this process, and the cache folder JAX used.
"""

import argparse
import json
import os

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--input", help="a fold: protein names joined by --protein_delimiter")
parser.add_argument("--tokens", type=int, help="compile for this bucket only (no fold, no output)")
parser.add_argument("--output_directory")
parser.add_argument("--data_directory", default="data")
parser.add_argument("--protein_delimiter", default="+")
parser.add_argument("--buckets", default="32,64")
parser.add_argument("--jax_compilation_cache_dir")
args = parser.parse_args()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

if args.jax_compilation_cache_dir:
    jax.config.update("jax_compilation_cache_dir", args.jax_compilation_cache_dir)

counts = {"requests": 0, "hits": 0}
EVENTS = {"/jax/compilation_cache/compile_requests_use_cache": "requests",
          "/jax/compilation_cache/cache_hits": "hits"}


def count(event, **_):
    if event in EVENTS:
        counts[EVENTS[event]] += 1


jax.monitoring.register_event_listener(count)


def residues(name):
    with open(os.path.join(args.data_directory, name + ".fasta")) as stream:
        return "".join(line.strip() for line in stream if not line.startswith(">"))


def bucket_of(tokens):
    buckets = sorted(int(b) for b in args.buckets.split(","))
    return next((b for b in buckets if b >= tokens), tokens)


@jax.jit
def fold_model(weights, tokens, mask):
    x = weights["embed"][tokens] * mask[:, None]
    pair = jax.nn.softmax(x @ x.T / jnp.sqrt(x.shape[-1]), axis=-1)
    return (pair @ x @ weights["head"]).sum(axis=0)


key = jax.random.PRNGKey(0)
weights = {"embed": jax.random.normal(key, (32, 16)), "head": jax.random.normal(key, (16, 4))}
if args.tokens:
    sequence, bucket = "A" * args.tokens, args.tokens
else:
    sequence = "".join(residues(name) for name in args.input.split(args.protein_delimiter))
    bucket = bucket_of(len(sequence))
tokens = jnp.array([ord(c) % 32 for c in sequence] + [0] * (bucket - len(sequence)))
mask = jnp.array([1.0] * len(sequence) + [0.0] * (bucket - len(sequence)))
scores = [round(float(s), 4) for s in fold_model(weights, tokens, mask)]
if args.output_directory:
    os.makedirs(args.output_directory, exist_ok=True)
    result = {"fold": args.input, "residues": len(sequence), "bucket": bucket,
              "scores": scores, "cache": counts,
              "cache_dir_used": jax.config.jax_compilation_cache_dir,
              "exported_cache_dir": os.environ.get("JAX_COMPILATION_CACHE_DIR"),
              "device": jax.devices()[0].device_kind}
    with open(os.path.join(args.output_directory, "ranking_debug.json"), "w") as stream:
        json.dump(result, stream, indent=1)
