"""gpu-cache's startup hook: per-process cache statistics, without touching user code.

gpu-cache puts this folder first on ``PYTHONPATH`` when ``stats_hook`` or ``single_flight``
is on. This file is what every Python process loads: it reads the facts the kinds' pieces
declare in their first lines (``_Piece``: the modules they watch, what starts at start, the
folders made or judged for them, their tier layout, their software), acts on them, installs an
import watcher, and nothing else; it, the record and the tier loop over those facts and never
name a kind. The rest of the hook is the package ``gpu_cache_hook`` beside it (its docstring is
the map), loaded only where needed (issue 19). Its names below are the job environment's, the
host's too (``gpu_cache.core.names`` imports them; imported so, this file starts nothing).

Rules it keeps:

- standard library only, and nothing but the watcher in a process that imports no module a
  piece watches (and, where a piece starts at start, its start: the ptxas shim's set-up,
  about 1 ms);
- never breaks a job: any error is swallowed with at most one warning line on stderr (none
  when stderr is closed), and the job's exit code and output stay as without the hook;
- records nothing without an absolute ``$GPU_CACHE_RECORDS``, and a piece installs nothing
  without it, an absolute ``$GPU_CACHE_LOCKS``, the tier or its own variable;
- one per process: several copies of this file on ``sys.path`` (two checkouts, or one reached
  through a symlink) act as one. The first copy that runs marks the process (an attribute of
  ``sys``); any later copy that still gets run does nothing; the copies, and older versions of
  the hook, are skipped when the next ``sitecustomize`` is looked for. A piece always comes from
  the folder of the copy that runs (never another checkout's copy of another version);
- it runs the user's own ``sitecustomize`` (the next one on ``sys.path`` that is not a copy
  of this hook) exactly once, instead of shadowing it, and reports its errors as Python does.
"""

import os
import sys

#: Marks this file as gpu-cache's startup hook: a copy of it found later on ``sys.path`` is
#: recognised by this text (in its source or its bytecode) and never run. Keep it verbatim:
#: every copy since the marker (the whole hook in this one file, before issue 19, too) has it.
_HOOK_MARKER = "gpu-cache startup hook: one per process"
#: Names that every version of the hook before the marker has (source and bytecode): such an
#: older copy later on ``sys.path`` is skipped too.
_LEGACY_SIGNS = (b"_ImportWatcher", b"_run_user_sitecustomize", b"GPU_CACHE_RECORDS")
#: The class name of the import watcher of the versions before the marker (they set no mark).
_LEGACY_WATCHER = "_ImportWatcher"
#: The attribute of ``sys`` that says that a copy of the hook already runs in this process.
_SYS_MARK = "_gpu_cache_startup_hook"

# The job environment's names that the hook uses, in their one home: the pieces import them from
# here, and so does gpu_cache.core.names, which holds the host's own beside them.
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
#: Environment variables that change cache keys or where a cache is: kept in each record,
#: shown by doctor, compared by explain.
KEY_ENVIRONMENT = ("XLA_FLAGS", "JAX_ENABLE_X64", "CUDA_VISIBLE_DEVICES", "JAX_COMPILATION_CACHE_DIR",
                   "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES", "LIBTPU_INIT_ARGS", "TRITON_DEFAULT_FP_FUSION",
                   "TRITON_DISABLE_LINE_INFO")
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

#: The first line of a kind's piece (``gpu_cache_hook/kinds/<kind>.py`` or ``<kind>/__init__.py``),
#: whose facts follow; read without importing it (importing every piece costs about 1 ms).
_PIECE_LINE = b"# gpu-cache hook piece\n"
#: The package of the pieces, beside this file.
_PACKAGE = "gpu_cache_hook"
#: The hook's own folder that may be node-local, with the name the record's ``fallbacks`` gives
#: it (the kinds' folders are the pieces' ``node-local`` facts; the locks' is judged where it is
#: used, in ``_install``).
_OWN_NODE_LOCAL = ((RECORDS_VAR, RECORDS_VAR),)

_HERE = globals().get("__file__")


def _stderr(text):
    """Write to stderr when there is one; never raises."""
    try:
        stream = sys.stderr
        if stream is not None:
            stream.write(text)
            stream.flush()
    except Exception:
        pass


class _Hook:
    """What the pieces of the hook share in this process; each piece gets it."""

    def __init__(self):
        self.warned = False
        self._held = None  # a lesser warning line, printed at exit (False: printed, or exiting)
        self.folder = None  # the records folder; None: no records
        self.flight = False  # single-flight wanted ($GPU_CACHE_LOCKS)
        self.tier = False  # the node-local tier wanted ($GPU_CACHE_TIER, $GPU_CACHE_SHARED)
        self.pieces = ()  # the kinds' pieces beside this file (_Piece)
        self.loaded = []  # the pieces whose module this process loaded, in that order
        self.libraries = set()  # the kinds whose library this process imported (``observed``)
        self.parts = {}  # what goes into the record beside the pieces' sections: "fallbacks"
        self.started = {}  # the folders the hook makes, as they were once it had started
        self._exit = False

    @property
    def watching(self):
        """Whether the hook records, single-flights or tiers in this process: what the pieces
        of the kinds whose library a job imports do."""
        return bool(self.folder or self.flight or self.tier)

    def warn(self, what, exc, off=False):
        """One warning line per process at most; never raises. ``off``: the problem turned a
        cache off, and is printed at once. A lesser one (a count or record the hook lost) waits
        for the exit, and is printed there only when no cache went off meanwhile: the line
        says what matters most."""
        if self.warned:
            return
        try:
            detail = repr(exc)
            detail = detail if len(detail) <= 300 else detail[:300] + "..."
        except Exception:
            detail = type(exc).__name__
        line = f"gpu-cache: warning: stats hook disabled part of itself ({what}: {detail})\n"
        if off or self._held is False:  # (False: past the exit's turn)
            self.warned = True
            _stderr(line)
        elif self._held is None:
            self._held = line

    def print_held(self):
        """At exit, after every other exit handler of the hook (registered first, so run last:
        one registered while the exit handlers run would not run)."""
        held, self._held = self._held, False
        if held and not self.warned:
            self.warned = True
            _stderr(held)

    @staticmethod
    def compile_worker():
        return _compile_worker()

    def observed(self, kind):
        """The library of ``kind`` was imported: the record is written at exit (the exit handler
        is registered only now, so a process without such a library loads nothing for it)."""
        self.libraries.add(kind)
        if self.folder and not self._exit and not _compile_worker():  # (its parent writes one)
            import atexit

            self._exit = True
            atexit.register(self._write_record)

    def _write_record(self):
        try:
            package()
            from gpu_cache_hook import records

            records.write(self)
        except Exception as exc:
            self.warn("writing the record", exc)


_HOOK = _Hook()


def _machinery():
    """importlib's PathFinder and module_from_spec as loaded at start (importing importlib.util
    would cost more than everything else this file does)."""
    bootstrap = sys.modules.get("_frozen_importlib")
    external = sys.modules.get("_frozen_importlib_external")
    path_finder = getattr(external, "PathFinder", None)
    module_from_spec = getattr(bootstrap, "module_from_spec", None)
    if path_finder is None or module_from_spec is None:
        import importlib.machinery
        import importlib.util

        path_finder, module_from_spec = importlib.machinery.PathFinder, importlib.util.module_from_spec
    return path_finder, module_from_spec


def package():
    """Load the package of the pieces from this file's folder, not from whatever ``sys.path``
    finds first (the job may have changed it by exit), never another checkout's of another
    version: its modules then come from it, by plain imports. The pieces import the job
    environment's names from ``sitecustomize``: where an older copy of the hook (one before the
    marker) runs under that name and ran this one, these names are registered under it first."""
    if _PACKAGE in sys.modules:
        return
    if getattr(sys.modules.get("sitecustomize"), "__dict__", None) is not globals():
        names = type(sys)("sitecustomize")
        names.__dict__.update(globals())
        sys.modules["sitecustomize"] = names
    path_finder, module_from_spec = _machinery()
    spec = path_finder.find_spec(_PACKAGE, [os.path.dirname(_HERE or "")])
    if spec is None or spec.loader is None:
        raise ImportError(f"{_PACKAGE} is missing beside {_HERE}", name=_PACKAGE)
    package = module_from_spec(spec)
    sys.modules[_PACKAGE] = package
    try:
        spec.loader.exec_module(package)
    except BaseException:
        sys.modules.pop(_PACKAGE, None)
        raise


class _Piece:
    """A kind's piece of the hook, as the comment lines after its first line declare it, one
    fact a line (``gpu_cache_hook/kinds/__init__.py`` says what each means); its module is
    loaded on first use."""

    def __init__(self, kind, lines):
        self.kind, self._module = kind, None
        self.watches, self.watches_with, self.watches_always, self.start_with = [], [], [], []
        self.makes, self.node_local, self.tier, self.software = [], [], [], []
        for line in lines:
            if line[:2] != b"# ":
                break
            word, *values = line[2:].decode("ascii").split()
            if word == "tier":
                self.tier.append(tuple(values))
            elif word == "watches-with":
                self.watches_with += [(values[0], module) for module in values[1:]]
            elif word in _FACTS:
                getattr(self, _FACTS[word]).extend(values)
            else:
                raise ValueError(f"the hook piece of {kind} declares {word!r}, which is no fact")

    def watched(self, hook, environ):
        """The modules after whose import the piece runs in this process."""
        found = self.watches_always + (self.watches if hook.watching else [])
        return found + [module for name, module in self.watches_with if os.path.isabs(environ.get(name, ""))]

    @property
    def module(self):
        """The piece's module, loaded on first use (from this file's folder: ``package``)."""
        if self._module is None:
            package()
            name = f"{_PACKAGE}.kinds.{self.kind}"
            __import__(name)
            self._module = sys.modules[name]
            _HOOK.loaded.append(self)
        return self._module


#: The facts of one or more plain words, and the attribute of ``_Piece`` that holds them.
_FACTS = {"watches": "watches", "watches-always": "watches_always", "start-with": "start_with",
          "makes": "makes", "node-local": "node_local", "software": "software"}


def pieces(here=None):
    """The pieces in ``gpu_cache_hook/kinds/`` beside this file (or in the hook folder
    ``here``), by kind: one listing, then one read of the head of each. A new kind's piece
    needs no line elsewhere."""
    folder = os.path.join(here or os.path.dirname(_HERE or ""), _PACKAGE, "kinds")
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
            head = os.read(fd, 1024)
        except OSError:  # a folder named like a module, a FIFO
            continue
        finally:
            os.close(fd)
        if head.startswith(_PIECE_LINE):
            found.append(_Piece(kind, head.split(b"\n", 16)[1:]))
    return found


def _compile_worker():
    """Whether this is one of Inductor's compile workers (up to 32 per process, started from
    this script, and the process that starts them): they leave the tier's copy-in of
    Inductor's files, single-flight of graphs and the record to the process that started them
    (a record of theirs would count one more process that compiled nothing, written while that
    process waits for them to exit)."""
    argv = getattr(sys, "argv", None) or [""]
    return os.path.basename(os.path.dirname(str(argv[0]))) == "compile_worker"


def _on_import(watching):
    def handler(module):
        for piece in watching:
            piece.module.on_import(module, _HOOK)

    return handler


class _Watcher:
    """A meta-path finder that runs a handler right after a watched import.

    Its ``find_spec`` asks the other finders for the spec. It never raises (an error means
    "not mine": the import goes on as without the hook) and is re-entrancy-safe: asked again
    by the same thread while it asks (another watcher that asks every finder, e.g. an older
    copy of this hook), it answers None, so two watchers never call each other forever.
    """

    def __init__(self, handlers):
        import _thread

        self._ident = _thread.get_ident
        self._busy = set()
        self._handlers = handlers  # module name -> handler(module)
        self._done = set()

    def find_spec(self, name, path=None, target=None):
        if name not in self._handlers or name in self._done:
            return None
        me = self._ident()
        if me in self._busy:
            return None
        self._busy.add(me)
        try:
            return self._find_spec(name, path, target)
        except Exception as exc:
            _HOOK.warn("import watcher", exc)
            return None
        finally:
            self._busy.discard(me)

    def _find_spec(self, name, path, target):
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original_exec = loader.exec_module

        def exec_module(module):
            original_exec(module)
            if name in self._done:  # reloaded: the handler ran already
                return
            self._done.add(name)
            try:
                self._handlers[name](module)
            except Exception as exc:
                _HOOK.warn(name, exc)

        loader.exec_module = exec_module
        return spec


def _read_small(path, limit=1 << 20):
    """At most ``limit`` bytes of a regular file; never blocks on a FIFO."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        chunks, size = [], 0
        while size < limit:
            chunk = os.read(fd, limit - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _is_hook_copy(path):
    """Whether the file at ``path`` is a copy of this hook, of this version or an older one."""
    try:
        data = _read_small(path)
    except OSError:
        return False
    return _HOOK_MARKER.encode() in data or all(sign in data for sign in _LEGACY_SIGNS)


def _file_id(path):
    try:
        info = os.stat(path)
    except OSError:
        return os.path.realpath(path)
    return (info.st_dev, info.st_ino)


def _run_user_sitecustomize(here):
    """Run the next ``sitecustomize`` on sys.path that is not a copy of this hook (this file
    through another path, another checkout's, an older version's), so a user's own one still
    runs, once. Its errors are reported as Python's ``site`` reports them without the hook."""
    path_finder, module_from_spec = _machinery()
    seen = {_file_id(here)} if here else set()
    for entry in list(sys.path):
        try:
            spec = path_finder.find_spec("sitecustomize", [entry])
        except Exception:
            continue
        if spec is None or spec.loader is None:
            continue
        if spec.origin and spec.has_location:
            found = _file_id(spec.origin)
            if found in seen:
                continue
            seen.add(found)
            if _is_hook_copy(spec.origin):
                continue
        module = module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            if isinstance(exc, ImportError) and exc.name == "sitecustomize":
                return
            if sys.flags.verbose:
                sys.excepthook(*sys.exc_info())
            else:
                _stderr("Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
                        f"{exc.__class__.__name__}: {exc}\n")
        return


def _node_local(folder):
    """Whether ``folder`` is one of gpu-cache's node-local folders
    (``$TMPDIR/gpu-cache-<uid>/<kind>``): made on each node, by whoever comes first, so
    checked on each node (``trust``)."""
    return os.path.basename(os.path.dirname(folder.rstrip(os.sep))) == f"{NODE_LOCAL_PREFIX}{os.getuid()}"


def _made(piece, name):
    """The folder ``$name``, which the kind's tool makes at start and fails where it cannot
    (Triton, in a read-only image where the cache root is not bound): made here, else ``$name``
    is pointed at a folder the process can use (``trust.unmade``). One stat where it exists."""
    folder = os.environ.get(name)
    if not folder or os.path.isdir(folder):
        return
    try:
        os.makedirs(folder, exist_ok=True)
        return
    except OSError as exc:
        why = exc.strerror or repr(exc)
    package()
    from gpu_cache_hook import trust

    trust.unmade(piece.kind, name, folder, why, _HOOK, _stderr)


def _guard(found):
    """A node-local tier or fallback folder this job was given is judged on this node before
    any tool reads it: ``gpu-cache env`` checked it where it ran, but another user may have
    made it here first (``trust.guard``). Costs a few string tests when the job has none."""
    tier = os.environ.get(TIER_VAR, "")
    tier = os.path.normpath(tier) if os.path.isabs(tier) and os.path.isabs(
        os.environ.get(SHARED_VAR, "")) else ""
    declared = [(piece.kind, name) for piece in found for name in piece.node_local] + list(_OWN_NODE_LOCAL)
    folders = [(what, name) for what, name in declared if _node_local(os.environ.get(name) or "")
               and not (tier and os.environ[name].startswith(tier + os.sep))]
    if tier or folders:
        package()
        from gpu_cache_hook import trust

        trust.guard(tier, [piece.kind for piece in found if piece.tier], folders, _HOOK, _stderr)


def _start(found):
    """What the pieces do at start, before the job's code runs: judge the node-local folders,
    make the folders their tools need, then each piece's own start."""
    try:
        _guard(found)
    except Exception as exc:  # the tier is not used then: nothing unjudged is read
        os.environ[TIER_VAR] = ""
        _HOOK.warn("judging the node-local folders", exc)
    for piece in found:
        for name in piece.makes:
            try:
                _made(piece, name)
            except Exception as exc:  # that cache is off; the rest of the hook still works
                _HOOK.warn(f"{piece.kind} folder", exc, off=True)


def _install():
    try:
        found = _HOOK.pieces = tuple(pieces())
    except Exception as exc:  # no kind's piece then; the records of the hook's own still work
        found = ()
        _HOOK.warn("finding the kinds' pieces", exc)
    _start(found)
    folder = os.environ.get(RECORDS_VAR) or None
    locks = os.environ.get(LOCKS_VAR)
    _HOOK.flight = bool(locks) and os.path.isabs(locks)
    if _HOOK.flight and _node_local(locks):
        try:
            package()
            from gpu_cache_hook import trust

            _HOOK.flight = trust.locks_node_local(locks, _HOOK, _stderr)
        except Exception as exc:
            _HOOK.flight = False
            _HOOK.warn("single-flight's node-local folder", exc)
    # An older copy of this hook (before the marker) that ran first watches and records
    # already: a second watcher would only write a second record.
    if folder and any(type(finder).__name__ == _LEGACY_WATCHER for finder in sys.meta_path):
        folder = None
    _HOOK.folder = folder
    tier, shared = os.environ.get(TIER_VAR, ""), os.environ.get(SHARED_VAR, "")
    _HOOK.tier = os.path.isabs(tier) and os.path.isabs(shared)
    for piece in found:
        if any(os.path.isabs(os.environ.get(name, "")) for name in piece.start_with):
            try:
                piece.module.start(_HOOK)
            except Exception as exc:
                _HOOK.warn(f"{piece.kind} at start", exc, off=True)
    _HOOK.started = {name: os.environ.get(name) for piece in found for name in piece.makes}
    watching = {}
    for piece in found:
        for name in piece.watched(_HOOK, os.environ):
            if piece not in watching.setdefault(name, []):
                watching[name].append(piece)
    sys.meta_path.insert(0, _Watcher({name: _on_import(them) for name, them in watching.items()}))


def _main():
    if getattr(sys, _SYS_MARK, None) is not None:
        return  # another copy of this hook runs in this process, and ran the user's one
    try:
        setattr(sys, _SYS_MARK, {"file": _HERE, "marker": _HOOK_MARKER})
        import atexit

        atexit.register(_HOOK.print_held)
        _install()
    except Exception as exc:  # never break the interpreter's start
        _HOOK.warn("install", exc)
    try:
        _run_user_sitecustomize(_HERE)
    except Exception as exc:  # the hook's own fault: the user's errors are reported inside
        _HOOK.warn("finding your sitecustomize", exc)


# The hook starts where Python's site runs this file at start-up. Imported for its names alone
# (by the ptxas shim, which runs isolated with -S, or under another module name), it starts nothing.
if __name__ == "sitecustomize" and not sys.flags.no_site:
    _main()
