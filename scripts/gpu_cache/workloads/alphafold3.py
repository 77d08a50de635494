"""Built-in workload ``alphafold3``: one AlphaFold 3 prediction per token bucket, as inference
will compile it (issue 24).

``python -m gpu_cache.workloads.alphafold3 --shape 512 --buckets 256,512,1024 [--model-dir
/weights]`` writes a synthetic input (one poly-glycine protein chain of 512 residues, so 512
tokens: exactly the 512 bucket; no MSA, no templates, one seed) and runs the image's own
``run_alphafold.py`` on it with the data pipeline off, the weights and the same ``--buckets``
as inference, so that the compiled programs are those of the jobs.

Without ``--model-dir`` no weights are used (issue 39): the image's AlphaFold 3 writes random
parameters of the shapes and dtypes it builds, in its own format
(:mod:`gpu_cache.workloads.alphafold3_weights`), into a private temporary folder (mode 0700),
``run_alphafold.py`` runs on them, and the folder is removed afterwards, also when the run fails
or is stopped with SIGTERM, SIGINT or SIGHUP. The weights are arguments of the jitted network,
so the programs compiled are those the real weights run. An image whose AlphaFold 3 cannot make
them exits 2 with one line that says why (then give ``--model-dir``). Without
``--script`` it finds ``run_alphafold.py`` in the image (:func:`find_script`) and says where on
stderr. Anything
after ``--`` goes to ``run_alphafold.py`` as is (flags that change the compiled model, such as
``--num_diffusion_samples`` or ``--flash_attention_implementation``, must be the jobs' own).
The prediction is written into a temporary folder and thrown away. Prints one JSON line.
Python 3.9+, standard library only.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from gpu_cache.workloads import outputs

#: Where images keep AlphaFold 3's ``run_alphafold.py``, looked at in this order: AlphaFold 3's
#: own image (its Dockerfile: ``COPY . /app/alphafold``) and AlphaPulldown's AlphaFold 3 images
#: (``docker/alphafold3.dockerfile``: AlphaPulldown with AlphaFold 3 as its ``alphafold3``
#: submodule, in ``/app/AlphaPulldown`` from tag 2.1.8 to 2.6.2, in ``/AlphaPulldown`` from
#: 2.0.2 to 2.1.5).
KNOWN_SCRIPTS = ("/app/alphafold/run_alphafold.py", "/app/AlphaPulldown/alphafold3/run_alphafold.py",
                 "/AlphaPulldown/alphafold3/run_alphafold.py")
#: Then, where neither is: ``run_alphafold.py`` on PATH, then at most two folders below these.
SEARCHED = ("/app", "/opt")


def fold_input(residues: int) -> dict:
    """AlphaFold 3's input (dialect ``alphafold3``, version 1) of one poly-glycine chain."""
    return {
        "name": f"gpu_cache_warm_{residues}",
        "sequences": [{"protein": {"id": "A", "sequence": "G" * residues, "unpairedMsa": "",
                                   "pairedMsa": "", "templates": []}}],
        "modelSeeds": [1],
        "dialect": "alphafold3",
        "version": 1,
    }


def command(python: str, script: str, json_path: str, output_dir: str, model_dir: str,
            buckets: list[int], extra: list[str]) -> list[str]:
    """The ``run_alphafold.py`` command line of one bucket."""
    return [python, script, f"--json_path={json_path}", f"--output_dir={output_dir}",
            f"--model_dir={model_dir}", "--norun_data_pipeline", "--run_inference",
            f"--buckets={','.join(str(b) for b in buckets)}", *extra]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="alphafold3", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", required=True, help="the token bucket to compile")
    parser.add_argument("--buckets", required=True,
                        help="every bucket inference uses, comma-separated (run_alphafold.py's --buckets)")
    parser.add_argument("--model-dir", help="the folder of the AlphaFold 3 weights (default: none; "
                                            "random parameters, made for the run and deleted)")
    parser.add_argument("--script", help="AlphaFold 3's run_alphafold.py (default: found in the "
                                          f"image: {', '.join(KNOWN_SCRIPTS)}, PATH, "
                                          f"{' and '.join(SEARCHED)})")
    args = parser.parse_args(argv)
    args.extra = extra
    try:
        args.shape = int(args.shape)
        args.buckets = [int(b) for b in args.buckets.split(",")]
        if args.shape <= 0 or any(b <= 0 for b in args.buckets):
            raise ValueError("sizes must be positive")
        if args.buckets != sorted(set(args.buckets)):
            raise ValueError("--buckets must be strictly increasing")
        if args.shape not in args.buckets:
            raise ValueError(f"--shape {args.shape} is not one of --buckets")
    except ValueError as exc:
        parser.exit(2, f"alphafold3: error: {exc}\n")
    if args.script is None:
        args.script = find_script()
        if args.script is None:
            parser.exit(2, "alphafold3: error: found no run_alphafold.py (looked at "
                           f"{', '.join(KNOWN_SCRIPTS)}, on PATH and under {' and '.join(SEARCHED)}): "
                           "set the workload's script: to where the image keeps it\n")
        print(f"alphafold3: using {args.script}, found in the image (the workload's script: "
              "was not set)", file=sys.stderr, flush=True)
    elif not os.path.isfile(args.script):
        parser.exit(2, f"alphafold3: error: no run_alphafold.py at {args.script} (the workload's "
                       "script: in the config)\n")
    if args.model_dir is not None and not os.path.isdir(args.model_dir):
        parser.exit(2, f"alphafold3: error: the weights folder {args.model_dir} does not exist "
                       "(the workload's model_dir: in the config)\n")
    return args


def find_script(root: str = "/") -> str | None:
    """Where this image keeps ``run_alphafold.py`` (``root``: the image's top folder, for
    tests): the first of :data:`KNOWN_SCRIPTS`, else the one on ``PATH``, else the first in
    a folder at most two below :data:`SEARCHED`, in name order; None when there is none."""
    for path in KNOWN_SCRIPTS:
        if os.path.isfile(os.path.join(root, path.lstrip("/"))):
            return os.path.join(root, path.lstrip("/"))
    on_path = shutil.which("run_alphafold.py") if root == "/" else None
    if on_path:
        return on_path
    for top in SEARCHED:
        for depth in ("*", "*/*"):
            pattern = os.path.join(root, top.lstrip("/"), depth, "run_alphafold.py")
            found = sorted(path for path in glob.glob(pattern) if os.path.isfile(path))
            if found:
                return found[0]
    return None


def _stop(signum, _frame):
    raise SystemExit(128 + signum)  # the finally blocks remove the temporary folders


#: The random weights' seed of a run that reports its outputs.
OUTPUTS_SEED = 0


def random_weights(folder: str) -> tuple[int, str | None]:
    """Have the image's AlphaFold 3 write random weights into ``folder``: (exit code, why it
    cannot, or None)."""
    from gpu_cache.core import names
    from gpu_cache.workloads import alphafold3_weights

    env = dict(os.environ)
    env.pop(names.RECORDS_VAR, None)  # it compiles nothing: no process of the workload's counts
    # Runs whose outputs the proof keeps or compares (issue 47: the warm writer's, validate's,
    # the cold figure's) run on the same values; a run that reports none draws its own.
    seed = str(OUTPUTS_SEED if outputs.wanted() else int.from_bytes(os.urandom(4), "little"))
    done = subprocess.run([sys.executable, "-m", "gpu_cache.workloads.alphafold3_weights", folder,
                           "--seed", seed], env=env, stdout=sys.stdout, stderr=subprocess.PIPE, text=True,
                          errors="replace")
    if done.returncode == alphafold3_weights.UNSUPPORTED:
        return done.returncode, (done.stderr.strip().splitlines() or ["?"])[-1]
    sys.stderr.write(done.stderr)
    return done.returncode, None


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    started = time.perf_counter()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _stop)
    with tempfile.TemporaryDirectory(prefix="gpu-cache-af3-") as scratch:
        model_dir = args.model_dir
        if model_dir is None:
            model_dir = os.path.join(scratch, "weights")
            os.mkdir(model_dir, 0o700)
            code, why = random_weights(model_dir)
            if why is not None:
                print(f"alphafold3: error: no weights given, and {why.split(': ', 1)[-1]}: set the "
                      "workload's model_dir: to the jobs' weights folder", file=sys.stderr, flush=True)
                return 2
            if code != 0:
                return code
        json_path = os.path.join(scratch, f"warm_{args.shape}.json")
        with open(json_path, "w") as out:
            json.dump(fold_input(args.shape), out)
        run = command(sys.executable, args.script, json_path, os.path.join(scratch, "out"),
                      model_dir, args.buckets, args.extra)
        code = subprocess.call(run)  # its output goes where the runner sends the workload's
        if code == 0:
            report_outputs(os.path.join(scratch, "out"))
    print(json.dumps({"workload": "alphafold3", "bucket": args.shape, "buckets": args.buckets,
                      "script": args.script, "weights": "given" if args.model_dir else "random, deleted",
                      "exit_code": code, "seconds": round(time.perf_counter() - started, 3)}))
    return code


def report_outputs(folder: str) -> None:
    """Report the prediction for validation's proof (issue 40), where the workload runner asks
    for outputs: the top-ranked model's atom coordinates (``<name>_model.cif``) and its
    confidences (every numeric field of ``<name>_confidences.json`` and
    ``<name>_summary_confidences.json``: pLDDT, PAE, contact probabilities, pTM, ranking
    score, ...). run_alphafold.py runs once: no second run gives its run-to-run noise."""
    if not outputs.wanted():
        return
    found: dict = {}
    for model in sorted(glob.glob(os.path.join(folder, "*", "*_model.cif")))[:1]:
        found["coordinates"] = atom_coordinates(model)
        for suffix in ("_confidences.json", "_summary_confidences.json"):
            try:
                with open(model[:-len("_model.cif")] + suffix) as stream:
                    fields = json.load(stream)
            except (OSError, ValueError):
                continue
            if isinstance(fields, dict):
                found.update({f"{suffix[1:-5]}/{name}": value for name, value in fields.items()
                              if numeric(value)})
    outputs.save(found)


def numeric(value) -> bool:
    """Whether ``value`` (from JSON) is a number or a non-empty rectangular-looking list of them."""
    if isinstance(value, list):
        return bool(value) and all(numeric(v) for v in value)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def atom_coordinates(path: str) -> list:
    """The ``_atom_site`` coordinates (x, y, z per atom) of an mmCIF file."""
    import shlex

    columns: list[str] = []
    axes: list[int] = []
    rows = []
    with open(path) as stream:
        for line in stream:
            if line.startswith("_atom_site."):
                columns.append(line.split()[0][len("_atom_site."):])
            elif columns and line.startswith(("ATOM", "HETATM")):
                axes = axes or [columns.index(axis) for axis in ("Cartn_x", "Cartn_y", "Cartn_z")]
                words = shlex.split(line)
                rows.append([float(words[at]) for at in axes])
    return rows


if __name__ == "__main__":
    sys.exit(main())
