"""Random AlphaFold 3 parameters for the ``alphafold3`` workload (issue 39): of the shapes and
dtypes the installed AlphaFold 3 builds, in its own format, so that its ``run_alphafold.py``
loads them as it loads the real weights and compiles the same programs (weights are arguments of
the jitted network: other values, the same executables).

``python -m gpu_cache.workloads.alphafold3_weights FOLDER [--seed N]`` writes ``FOLDER/af3.bin``:
the shapes come from ``jax.eval_shape`` of the network's ``init`` on a small featurised input
(nothing is computed or compiled), each array is written with AlphaFold 3's own
``params.encode_record``. Runs in the job's image, whose AlphaFold 3 it imports; exits 3 with one
line where that AlphaFold 3 lacks what this needs. Standard library only at import.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

#: The file AlphaFold 3's ``params.select_model_files`` picks in a folder of one model.
FILE_NAME = "af3.bin"
#: Exit code: the image's AlphaFold 3 cannot do this (its missing piece is printed).
UNSUPPORTED = 3


class Unsupported(Exception):
    """The image's AlphaFold 3 lacks a piece this needs."""


def _modules():
    """AlphaFold 3's pieces this uses. Raises Unsupported (which one is missing)."""
    import importlib

    found = {}
    for name in ("haiku", "jax", "jax.numpy", "numpy", "alphafold3.common.folding_input",
                 "alphafold3.constants.chemical_components", "alphafold3.data.featurisation",
                 "alphafold3.model.model", "alphafold3.model.params",
                 "alphafold3.model.components.utils"):
        try:
            found[name] = importlib.import_module(name)
        except ImportError as exc:
            raise Unsupported(f"cannot import {name} ({exc})") from None
    if not callable(getattr(found["alphafold3.model.params"], "encode_record", None)):
        raise Unsupported("alphafold3.model.params has no encode_record (AlphaFold 3's parameter format)")
    return found


def _config(model):
    """The network's config, with XLA attention: the parameters do not depend on the kernel,
    and tokamax's Triton attention cannot be traced on a CPU."""
    try:
        from alphafold3.model import config_factory  # ColabFold's fork
    except ImportError:
        config = model.Model.Config()  # DeepMind's: run_alphafold.py builds on the default
        config.global_config.flash_attention_implementation = "xla"
        return config
    return config_factory.make_model_config(flash_attention_implementation="xla")


def shapes():
    """``{scope: {name: jax.ShapeDtypeStruct}}`` of the installed AlphaFold 3's parameters."""
    m = _modules()
    jax, jnp, hk = m["jax"], m["jax.numpy"], m["haiku"]
    model = m["alphafold3.model.model"]
    config = _config(model)
    fold = m["alphafold3.common.folding_input"].Input.from_json(json.dumps({
        "name": "gpu_cache_shapes", "modelSeeds": [1], "dialect": "alphafold3", "version": 1,
        "sequences": [{"protein": {"id": "A", "sequence": "GGGG", "unpairedMsa": "", "pairedMsa": "",
                                   "templates": []}}]}))
    (batch,) = m["alphafold3.data.featurisation"].featurise_input(
        fold_input=fold, ccd=m["alphafold3.constants.chemical_components"].Ccd(), buckets=[16])
    batch = m["alphafold3.model.components.utils"].remove_invalidly_typed_feats(batch)
    forward = hk.transform(lambda b: model.Model(config)(b))
    return jax.eval_shape(forward.init, jax.ShapeDtypeStruct((2,), jnp.uint32), batch)


def write(folder: str, seed: int) -> dict:
    """Write random parameters into ``folder`` (its own new file, mode 0600); what was written."""
    found = shapes()  # first: it says which piece the image's AlphaFold 3 lacks
    import numpy as np
    from alphafold3.model import params

    # One draw as long as the largest array, sliced for each: as random as the values need to be
    # (they change no program), in a fraction of a full draw's time.
    largest = max(int(np.prod(spec.shape)) for arrays in found.values() for spec in arrays.values())
    pool = np.random.default_rng(seed).standard_normal(largest, dtype=np.float32) * 0.02
    count = values = 0
    fd = os.open(os.path.join(folder, FILE_NAME), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as out:
        for scope in sorted(found):
            for name in sorted(found[scope]):
                spec = found[scope][name]
                array = pool[:int(np.prod(spec.shape))].reshape(spec.shape).astype(spec.dtype)
                out.write(params.encode_record(scope, name, array))
                count, values = count + 1, values + array.size
    return {"arrays": count, "values": int(values), "bytes": os.path.getsize(os.path.join(folder, FILE_NAME))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="alphafold3_weights", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="an existing private folder to write af3.bin into")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        done = write(args.folder, args.seed)
    except Unsupported as exc:
        print(f"alphafold3_weights: the image's AlphaFold 3 cannot make random weights: {exc}",
              file=sys.stderr, flush=True)
        return UNSUPPORTED
    print(json.dumps({"weights": "random", "seed": args.seed, **done,
                      "seconds": round(time.perf_counter() - started, 3)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
