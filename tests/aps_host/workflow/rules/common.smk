# Helpers of the look-alike: container binds, folds, batches, inference flags. The same
# jobs as AlphaPulldownSnakemake's, in a few lines of our own.

import os
from os.path import abspath, join
from pathlib import Path


def first_level_roots(paths):
    """The top-level folders (/tmp, /scratch, ...) of paths, as the container binds them."""
    roots = set()
    for path in paths:
        parts = Path(abspath(path)).parts
        if len(parts) >= 2 and os.path.isdir("/" + parts[1]):
            roots.add("/" + parts[1])
    return sorted(roots)


def prepare_container_binds(paths):
    """Bind the top-level folders of the inputs, outputs and workflow into the prediction
    container: set at parse time, never over a value the user set."""
    spec = ",".join(f"{root}:{root}" for root in first_level_roots(paths))
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


def fold_sequences(fold, data_directory, delimiter):
    """The sequence files of a fold's proteins (AlphaPulldownSnakemake: their features)."""
    return [join(data_directory, name + ".fasta") for name in fold.split(delimiter)]


def fold_residues(fold, data_directory, delimiter):
    total = 0
    for name in fold.split(delimiter):
        with open(join(data_directory, name + ".fasta")) as stream:
            total += sum(len(line.strip()) for line in stream if not line.startswith(">"))
    return total


def bin_folds(folds, sizes, batch_size):
    """Batches of at most batch_size folds, largest first; a batch is named by its first fold."""
    ordered = sorted(folds, key=lambda fold: -sizes[fold])
    batches = [ordered[i : i + batch_size] for i in range(0, len(ordered), batch_size)]
    return {batch[0]: batch for batch in batches}


def batch_inference_args(arguments, batch_size, jax_cache_dir):
    """The inference flags; batches of several folds share a JAX compilation cache folder
    of their own (as AlphaPulldownSnakemake does for AlphaFold 3)."""
    arguments = dict(arguments)
    if batch_size > 1:
        arguments.setdefault("--jax_compilation_cache_dir", jax_cache_dir)
    return arguments
