"""A prediction-like JAX job for the example host pipeline: a tiny attention model over N tokens.

    python predict.py --tokens 64 [--output FILE]

Writes (or prints) one JSON object: the tokens, what the persistent cache did in this process
(requests and hits from jax.monitoring), the cache environment the job saw and its host's name.
"""

import argparse
import json
import os
import socket
import sys

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--tokens", type=int, required=True)
parser.add_argument("--output")
args = parser.parse_args()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

counts = {"requests": 0, "hits": 0}
events = {"/jax/compilation_cache/compile_requests_use_cache": "requests",
          "/jax/compilation_cache/cache_hits": "hits"}


def count(event: str, **_) -> None:
    if event in events:
        counts[events[event]] += 1


jax.monitoring.register_event_listener(count)


@jax.jit
def predict(weights, tokens):
    x = weights["embed"][tokens]
    scores = jax.nn.softmax(x @ x.T / jnp.sqrt(x.shape[-1]), axis=-1)
    return (scores @ x @ weights["head"]).mean(axis=0)


key = jax.random.PRNGKey(0)
weights = {"embed": jax.random.normal(key, (256, 32)), "head": jax.random.normal(key, (32, 8))}
tokens = jnp.arange(args.tokens) % 256
scores = predict(weights, tokens).block_until_ready()
result = {
    "tokens": args.tokens,
    "scores": [round(float(s), 4) for s in scores],
    "cache": counts,
    "host": socket.gethostname(),
    "environment": {name: os.environ.get(name) for name in (
        "JAX_COMPILATION_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "CUDA_CACHE_PATH",
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID",
        "GPU_CACHE_TIER", "GPU_CACHE_SHARED")},
}
text = json.dumps(result, indent=1)
if args.output:
    with open(args.output, "w") as stream:
        stream.write(text + "\n")
else:
    print(text, file=sys.stdout)
