# Helpers of the look-alike, named and called as AlphaPulldownSnakemake's workflow/rules/common.smk
# names them (HEAD 3be454a), in a few lines of our own: container binds, backends, partitions,
# batches, inference flags and the inference jobs' memory.

import os
from os.path import abspath, join
from pathlib import Path

#: AlphaPulldownSnakemake's structure_inference host memory defaults by backend (MB).
INFERENCE_RAM_DEFAULTS = {
    "alphafold2": {"base_mb": 16000, "per_token_sq_mb": 0.0055, "runtime_minutes": 1440},
    "alphafold3": {"base_mb": 8000, "per_token_sq_mb": 0.0045, "runtime_minutes": 1440},
}


def normalize_backend(name, default="alphafold2"):
    """'alphafold3' for alphafold3 or af3, else 'alphafold2'."""
    value = str(name if name is not None else default).strip().lower()
    return "alphafold3" if value in ("alphafold3", "af3") else "alphafold2"


def normalize_partitions(value):
    """One partition, a comma- or space-separated string or a list, as one a,b string."""
    if value is None:
        return None
    items = value if isinstance(value, (list, tuple)) else str(value).replace(",", " ").split()
    names = []
    for item in items:
        if str(item).strip() and str(item).strip() not in names:
            names.append(str(item).strip())
    return ",".join(names) or None


def as_bool(value, default=False):
    if isinstance(value, bool):
        return value
    return default if value is None else str(value).strip().lower() in {"1", "true", "yes", "on"}


def prepare_container_binds(*, output_directory, config, feature_directories=(), input_files=()):
    """Bind the top-level folders (/tmp, /scratch, ...) of the workflow, the working and output
    folders, the databases, weights and features and the sample sheets into the containers:
    set at parse time, never over a value the user set."""
    interest = [Path(workflow.basedir), Path.cwd(), Path(output_directory)]
    interest += [
        Path(config[key]) for key in ("databases_directory", "backend_weights_directory") if config.get(key)
    ]
    interest += [Path(path) for path in feature_directories]
    interest += [Path(path).resolve().parent for path in input_files]
    roots = set()
    for path in interest:
        parts = Path(abspath(path)).parts
        if len(parts) >= 2 and os.path.isdir("/" + parts[1]):
            roots.add("/" + parts[1])
    spec = ",".join(f"{root}:{root}" for root in sorted(roots))
    for name in ("APPTAINER_BINDPATH", "SINGULARITY_BINDPATH"):
        os.environ.setdefault(name, spec)
    for name in ("APPTAINER_NV", "SINGULARITY_NV"):
        os.environ.setdefault(name, "1")


def read_folds(paths):
    """One fold per non-empty line of each sample sheet."""
    folds = []
    for path in paths:
        with open(path) as stream:
            folds += [line.strip() for line in stream if line.strip()]
    return folds


def fold_sequences(fold, feature_directories, delimiter):
    """The sequence files of a fold's proteins (AlphaPulldownSnakemake: their features), from
    the first feature directory that has each."""
    found = []
    for name in fold.split(delimiter):
        paths = [join(folder, name + ".fasta") for folder in feature_directories]
        found.append(next((path for path in paths if os.path.exists(path)), paths[0]))
    return found


def fold_total_tokens(fold, feature_directories, delimiter):
    total = 0
    for path in fold_sequences(fold, feature_directories, delimiter):
        with open(path) as stream:
            total += sum(len(line.strip()) for line in stream if not line.startswith(">"))
    return total


def bin_folds(fold_tokens, *, batch_size=1, max_batch_tokens=0):
    """Batches of at most batch_size folds (in order when 1; else smallest first)."""
    items = [(fold, int(tokens or 0)) for fold, tokens in fold_tokens]
    if batch_size <= 1:
        return [[fold] for fold, _ in items]
    ordered = [fold for fold, _ in sorted(items, key=lambda item: (item[1], item[0]))]
    return [ordered[i : i + batch_size] for i in range(0, len(ordered), batch_size)]


def batch_inference_args(base_args, *, backend, batch_size, jax_cache_dir):
    """The inference flags; AlphaFold 3 batches of several folds share a JAX compilation
    cache folder of their own, unless the user set one (setdefault)."""
    args = dict(base_args)
    if batch_size > 1 and backend == "alphafold2":
        args.setdefault("--allow_resume", "true")
    if batch_size > 1 and backend == "alphafold3":
        args.setdefault("--jax_compilation_cache_dir", jax_cache_dir)
    return args


def estimate_inference_mem_mb(total_tokens, *, base_mb, per_token_sq_mb, scaling, safety, attempt, cap_mb=0):
    """Host memory (MB) of a fold of total_tokens: safety x (base + per_token_sq x N^2), times
    scaling for each retry, at most cap_mb (0: no cap)."""
    value = safety * (base_mb + per_token_sq_mb * max(int(total_tokens), 0) ** 2)
    value = max(int(value * scaling ** max(int(attempt) - 1, 0)), 1)
    return min(value, int(cap_mb)) if cap_mb and cap_mb > 0 else value
