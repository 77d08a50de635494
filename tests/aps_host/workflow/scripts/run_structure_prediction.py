#!/usr/bin/env python3
"""A stand-in for AlphaPulldown's run_structure_prediction.py with --fold_backend=alphafold3:
it pads the fold to a token bucket and runs AlphaFold 3's model on it, as AlphaPulldown does.
It runs inside the prediction container (Python 3.9 and jax 0.4.30 in the tests), where
AlphaFold 3 lies where AlphaPulldown's images keep it (/app/AlphaPulldown/alphafold3; in the
tests a stand-in run_alphafold.py, whose model this calls).

    run_structure_prediction.py --input A+B --output_directory DIR \\
        --data_directory WEIGHTS --features_directory DATA [--buckets 128,256] \\
        [--jax_compilation_cache_dir DIR] [--fold_backend alphafold3]

Without --buckets it pads to AlphaPulldown's own default buckets (its flag's default in
alphapulldown/scripts/run_structure_prediction.py, 2.6.2), which start at 128 where
AlphaFold 3's run_alphafold.py starts at 256. Like AlphaPulldown, it applies
--jax_compilation_cache_dir with jax.config.update, over the environment's
JAX_COMPILATION_CACHE_DIR. Writes DIR/ranking_debug.json: the fold, the bucket, the backend
and weights it was given, what the persistent cache did in this process, and the cache folder
JAX used.
"""

import argparse
import json
import os
import sys

#: AlphaPulldown's --buckets default (2.6.2).
BUCKETS = "128,256,512,768,1024,1280,1536,2048,2560,3072,3584,4096,4608,5120"
#: Where AlphaPulldown's AlphaFold 3 images keep AlphaFold 3 (docker/alphafold3.dockerfile).
ALPHAFOLD3 = "/app/AlphaPulldown/alphafold3"

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--input", required=True, help="a fold: protein names joined by --protein_delimiter")
parser.add_argument("--output_directory", required=True)
parser.add_argument("--data_directory", required=True, help="the AlphaFold 3 weights")
parser.add_argument("--features_directory", default="data", help="the folds' sequences (FASTA)")
parser.add_argument("--protein_delimiter", default="+")
parser.add_argument("--buckets", default=BUCKETS)
# No default here: a job that lost the flag shows it (ranking_debug.json's fold_backend: null).
parser.add_argument("--fold_backend", choices=["alphafold3"])
parser.add_argument("--jax_compilation_cache_dir")
args = parser.parse_args()
if not os.path.isdir(args.data_directory):
    parser.exit(2, f"no weights folder {args.data_directory}\n")

sys.path.insert(0, ALPHAFOLD3)
import jax  # noqa: E402
import run_alphafold  # noqa: E402  (AlphaFold 3's model, as AlphaPulldown imports it)

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
    with open(os.path.join(args.features_directory, name + ".fasta")) as stream:
        return "".join(line.strip() for line in stream if not line.startswith(">"))


tokens = sum(len(residues(name)) for name in args.input.split(args.protein_delimiter))
bucket = next((b for b in sorted(int(b) for b in args.buckets.split(",")) if b >= tokens), tokens)
score = run_alphafold.predict(bucket)
os.makedirs(args.output_directory, exist_ok=True)
result = {"fold": args.input, "residues": tokens, "bucket": bucket, "score": round(score, 4),
          "fold_backend": args.fold_backend, "data_directory": args.data_directory,
          "cache": counts, "cache_dir_used": jax.config.jax_compilation_cache_dir,
          "exported_cache_dir": os.environ.get("JAX_COMPILATION_CACHE_DIR"),
          "device": jax.devices()[0].device_kind}
with open(os.path.join(args.output_directory, "ranking_debug.json"), "w") as stream:
    json.dump(result, stream, indent=1)
