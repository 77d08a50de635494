"""The job environment's names and what each kind's piece declares: the leaf of gpu-cache's
startup hook, which everything imports (``sitecustomize``, the hook's modules and pieces, the
host's ``gpu_cache.core.names`` and its kinds) and which imports nothing but ``os``.

The names are those the hook uses, in their one home (the host's own are beside them in
``gpu_cache.core.names``, which imports these). :func:`pieces` reads each kind's declaration, the
comment lines at the head of its piece (``kinds/__init__.py`` says what each fact means), without
importing the piece: ``sitecustomize`` acts on the facts in every process, the host reads its
kinds' job-side facts from them. Standard library only, Python 3.9+; nothing runs at import.
"""

import os

#: The folder of the startup hook's per-process records (unset, empty or relative: none).
RECORDS_VAR = "GPU_CACHE_RECORDS"
#: Single-flight: the lock folder (empty: off), how long a waiter waits (seconds), its mode.
LOCKS_VAR = "GPU_CACHE_LOCKS"
LOCK_TIMEOUT_VAR = "GPU_CACHE_LOCK_TIMEOUT"
LOCK_MODE_VAR = "GPU_CACHE_LOCK_MODE"
#: The node-local tier (issue 23): this root's local folder (empty: no tier in this process),
#: the cache root behind it, and the local tier's bound in bytes.
TIER_VAR = "GPU_CACHE_TIER"
SHARED_VAR = "GPU_CACHE_SHARED"
TIER_MAX_BYTES_VAR = "GPU_CACHE_TIER_MAX_BYTES"
#: Tests only: an absolute path a promotion creates, then sleeps, before it links its entry.
TIER_TEST_PAUSE_VAR = "GPU_CACHE_TIER_TEST_PAUSE"
#: A read-only root's Triton cache, read under the node-local one (the seed manager).
TRITON_SEED_VAR = "GPU_CACHE_TRITON_SEED"
#: The bytecode cache's folder (``bytecode_cache: true``).
BYTECODE_VAR = "GPU_CACHE_BYTECODE"
#: tokamax's autotuning results (issue 24), and ``1``: a warm process saves what it autotunes.
AUTOTUNE_VAR = "GPU_CACHE_AUTOTUNE"
AUTOTUNE_SAVE_VAR = "GPU_CACHE_AUTOTUNE_SAVE"
#: jax-triton's kernel cache (issue 34), and the ptxas shim's (its results for jaxlib).
JAX_TRITON_VAR = "GPU_CACHE_JAX_TRITON"
PTXAS_VAR = "GPU_CACHE_PTXAS"
#: The ptxas shim's own (the hook sets them for it): the real ptxas, the Python the shim runs
#: with, its tally of calls (read into the record), the mark of a call from the real ptxas, and
#: ``<pid>:<folder>``, the kernels jaxlib's Triton path made in process <pid> (issue 37).
PTXAS_REAL_VAR = "GPU_CACHE_PTXAS_REAL"
PTXAS_PYTHON_VAR = "GPU_CACHE_PTXAS_PYTHON"
PTXAS_TALLY_VAR = "GPU_CACHE_PTXAS_TALLY"
PTXAS_NESTED_VAR = "GPU_CACHE_PTXAS_NESTED"
PTXAS_KERNELS_VAR = "GPU_CACHE_PTXAS_KERNELS"
#: ``1``: Triton may import torch for its specialisation (the hook spares it otherwise).
TRITON_TORCH_VAR = "GPU_CACHE_TRITON_TORCH"
#: ``0``, ``off``, ``false`` or ``no`` switches the hook's tokamax fix off (issue 20).
TOKAMAX_FIX_VAR = "GPU_CACHE_TOKAMAX_FIX"
#: What a record names the job by: its rule, wildcards, GPU type, and the pass's run id.
RULE_VAR = "GPU_CACHE_RULE"
WILDCARDS_VAR = "GPU_CACHE_WILDCARDS"
GPU_TYPE_VAR = "GPU_CACHE_GPU_TYPE"
RUN_ID_VAR = "GPU_CACHE_RUN_ID"
# The tools' variables that gpu-cache sets.
JAX_CACHE_DIR_VAR = "JAX_COMPILATION_CACHE_DIR"
TRITON_CACHE_DIR_VAR = "TRITON_CACHE_DIR"
TRITON_MANAGER_VAR = "TRITON_CACHE_MANAGER"
INDUCTOR_CACHE_DIR_VAR = "TORCHINDUCTOR_CACHE_DIR"
TORCH_EXTENSIONS_DIR_VAR = "TORCH_EXTENSIONS_DIR"
CUDA_CACHE_PATH_VAR = "CUDA_CACHE_PATH"
#: Variables that name the container image a process runs in.
IMAGE_VARIABLES = ("APPTAINER_CONTAINER", "SINGULARITY_CONTAINER")
#: Single-flight's lock modes: ``flock`` alone, or ``flock`` within a node and a lease per key
#: across the nodes that share the lock folder.
NODE = "node"
CLUSTER = "cluster"
#: XLA's per-fusion autotune results, the value of JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES that
#: keeps only them (and their folder in JAX's cache folder).
XLA_AUTOTUNE_CACHE = "xla_gpu_per_fusion_autotune_cache_dir"
#: The per-user folder of node-local fallbacks and tiers: ``<tmp>/gpu-cache-<uid>``.
NODE_LOCAL_PREFIX = "gpu-cache-"
#: A copy or promotion's temporary file: ``.gpu-cache-tmp.<host>.<pid>.<random>``.
TEMP_PREFIX = ".gpu-cache-tmp."
#: The local tier's trim stamp, and the lock that lets one process trim at a time.
TRIM_STAMP = ".gpu-cache-trim"
TRIM_LOCK = ".gpu-cache-trim.lock"
#: Small state files under the cache root (measurements, verdicts; not a cache kind).
STATE_FOLDER = "state"
#: The entries of a tiered kind that validation set aside (issue 40), which every node's
#: local tier drops: ``<root>/<STATE_FOLDER>/set-aside-<kind>.json``.
SET_ASIDE_PREFIX = "set-aside-"
#: A local tier's mark of the set-aside list it applied: ``.gpu-cache-set-aside.<kind>.<state>``.
SET_ASIDE_SEEN = ".gpu-cache-set-aside."

#: The first line of a kind's piece (``kinds/<kind>.py`` or ``kinds/<kind>/__init__.py``), whose
#: facts follow, within its first ``_PIECE_HEAD`` bytes.
_PIECE_LINE = b"# gpu-cache hook piece\n"
_PIECE_HEAD = 1024
#: The facts of plain words, and the attribute of :class:`Facts` that holds them.
_WORDS = {"watches": "watches", "watches-always": "watches_always", "start-with": "start_with",
          "makes": "makes", "node-local": "node_local", "software": "software",
          "key-environment": "key_environment", "place-environment": "place_environment"}


class Facts:
    """What a kind's piece declares in the comment lines after its first line, one fact a line
    (``kinds/__init__.py`` says what each means); none for a kind without a piece."""

    def __init__(self, kind, lines=()):
        self.kind = kind
        self.watches, self.watches_with, self.watches_always, self.start_with = [], [], [], []
        self.makes, self.node_local, self.tier, self.software = [], [], [], []
        self.key_environment, self.place_environment, self.cold = [], [], []
        for line in lines:
            if line[:2] != b"# ":
                break
            word, *values = line[2:].decode("ascii").split()
            if word == "tier":
                self.tier.append(tuple(values))
            elif word == "watches-with":
                self.watches_with += [(values[0], module) for module in values[1:]]
            elif word == "cold":
                self.cold += [tuple(value.split("=", 1)) for value in values]
                if any(len(setting) != 2 for setting in self.cold):
                    raise ValueError(f"the hook piece of {kind} declares cold {values}: not VAR=value")
            elif word in _WORDS:
                getattr(self, _WORDS[word]).extend(values)
            else:
                raise ValueError(f"the hook piece of {kind} declares {word!r}, which is no fact")

    def watched(self, watching, environ):
        """The modules after whose import the piece runs in a process (``watching``: the hook
        records, single-flights or tiers there)."""
        found = self.watches_always + (self.watches if watching else [])
        return found + [module for name, module in self.watches_with if os.path.isabs(environ.get(name, ""))]


def pieces(folder=None, of=Facts):
    """The facts of each piece in ``kinds/`` beside this file (or in the pieces' folder
    ``folder``), by kind, as ``of(kind, lines)``: one listing, then one read of the head of
    each. A new kind's piece needs no line elsewhere."""
    folder = folder or os.path.join(os.path.dirname(__file__), "kinds")
    found = []
    for name in sorted(os.listdir(folder)):
        kind = name[:-3] if name.endswith(".py") else name
        if kind[:1] == "_" or not kind.isidentifier():
            continue
        try:
            fd = os.open(f"{folder}/{name}" if kind != name else f"{folder}/{name}/__init__.py",
                         os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:  # not a piece (a folder without one)
            continue
        try:
            head = os.read(fd, _PIECE_HEAD)
        except OSError:  # a folder named like a module, a FIFO
            continue
        finally:
            os.close(fd)
        if head.startswith(_PIECE_LINE):
            found.append(of(kind, head.split(b"\n", 16)[1:]))
    return found


def environment(found):
    """The variables that change what the kinds' tools compile, where their caches are or which
    devices run, as the pieces' facts ``found`` declare them (``key-environment``,
    ``place-environment``): what each record keeps, doctor shows and explain compares."""
    return tuple(dict.fromkeys(name for piece in found
                               for name in (*piece.key_environment, *piece.place_environment)))
