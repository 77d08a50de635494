"""gpu-cache's startup hook: per-process cache statistics, without touching user code.

gpu-cache puts this folder first on ``PYTHONPATH`` when ``stats_hook`` or ``single_flight``
is on. This file is what every Python process loads: it installs an import watcher (a few
microseconds) and nothing else. The rest of the hook is in pieces next to it, each loaded
only when needed (issue 19), from the package ``gpu_cache_hook`` beside it, whose
docstring is the map: a piece per kind in ``gpu_cache_hook/kinds/``, and the shared concerns
(``tier``, ``flight`` and ``locks``, ``records``, ``trust``, ``digest``, ``common``) at its top.

- ``kinds.jax`` when the process imports ``jax``: its cache listeners, the key parts for
  ``gpu-cache doctor --explain``, and JAX single-flight (all the coupling to ``jax._src``);
- ``kinds.triton`` when it imports ``triton``: Triton's listener and cache manager;
- ``kinds.inductor`` when it imports ``torch._inductor.codecache`` (and the two modules it
  also wraps): Inductor's hits and misses and single-flight (issue 31), never in Inductor's
  compile workers;
- ``kinds.tokamax`` when it imports ``tokamax._src.ops.op``: makes tokamax 0.0.12's JAX
  context before the first trace, which saves the second compile (issue 20; switched off with
  ``GPU_CACHE_TOKAMAX_FIX=0``); again when it has imported the ``tokamax`` package, with
  ``$GPU_CACHE_AUTOTUNE``: the autotuning results kept for this GPU type (issue 24);
- ``kinds.jax_triton`` when it imports ``jax_triton.triton_lib`` (with
  ``$GPU_CACHE_JAX_TRITON``, records or not): jax-triton's kernels kept across processes, and
  the ``TRITON_CACHE_DIR`` it clears put back (issue 34);
- ``kinds.<kind>``, the piece of any other kind found in ``kinds/``, when it imports the
  module the piece's first line names (``_found``); its ``section(hook)`` is the kind's part
  of the record;
- ``kinds.ptxas.piece`` at start, with ``$GPU_CACHE_PTXAS``: puts the ptxas shim first on the
  process's ``PATH`` where jax_triton is installed, so jaxlib's ptxas runs of Triton kernels
  are cached (issue 34);
- ``kinds.bytecode`` at start, with ``$GPU_CACHE_BYTECODE``;
- ``trust`` at start where a folder the job was given is node-local or cannot be created;
- ``records`` at exit: the JSON record of a process that imported a watched module, written
  into ``$GPU_CACHE_RECORDS``; ``flight`` (single-flight, with ``$GPU_CACHE_LOCKS``) and
  ``tier`` (the node-local tier, with ``$GPU_CACHE_TIER`` and ``$GPU_CACHE_SHARED``: issue
  23) through the pieces; the tier also when the process imports ``torch._inductor``.

Rules it keeps:

- standard library only, and nothing but the watcher in a process without jax or triton
  (and, where the ptxas cache is exported, the shim's set-up: about 1 ms);
- never breaks a job: any error is swallowed with at most one warning line on stderr (none
  when stderr is closed), and the job's exit code and output stay as without the hook;
- records nothing without an absolute ``$GPU_CACHE_RECORDS``, and installs nothing without
  it, an absolute ``$GPU_CACHE_LOCKS``, the tier or the tokamax fix;
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

# The job environment's names: the hook's one copy of those of gpu_cache.core.names that it
# uses (it cannot import the package, and loads nothing more in every process). The pieces
# import them from here; tests/test_names.py fails when one differs from gpu_cache.core.names.
RECORDS_VAR = "GPU_CACHE_RECORDS"
LOCKS_VAR = "GPU_CACHE_LOCKS"
LOCK_TIMEOUT_VAR = "GPU_CACHE_LOCK_TIMEOUT"
LOCK_MODE_VAR = "GPU_CACHE_LOCK_MODE"
TIER_VAR = "GPU_CACHE_TIER"
SHARED_VAR = "GPU_CACHE_SHARED"
TIER_MAX_BYTES_VAR = "GPU_CACHE_TIER_MAX_BYTES"
TIER_TEST_PAUSE_VAR = "GPU_CACHE_TIER_TEST_PAUSE"
TRITON_SEED_VAR = "GPU_CACHE_TRITON_SEED"
BYTECODE_VAR = "GPU_CACHE_BYTECODE"
AUTOTUNE_VAR = "GPU_CACHE_AUTOTUNE"
AUTOTUNE_SAVE_VAR = "GPU_CACHE_AUTOTUNE_SAVE"
JAX_TRITON_VAR = "GPU_CACHE_JAX_TRITON"
PTXAS_VAR = "GPU_CACHE_PTXAS"
PTXAS_REAL_VAR = "GPU_CACHE_PTXAS_REAL"
PTXAS_PYTHON_VAR = "GPU_CACHE_PTXAS_PYTHON"
PTXAS_TALLY_VAR = "GPU_CACHE_PTXAS_TALLY"
PTXAS_NESTED_VAR = "GPU_CACHE_PTXAS_NESTED"
PTXAS_KERNELS_VAR = "GPU_CACHE_PTXAS_KERNELS"
TRITON_TORCH_VAR = "GPU_CACHE_TRITON_TORCH"
TOKAMAX_FIX_VAR = "GPU_CACHE_TOKAMAX_FIX"
RULE_VAR = "GPU_CACHE_RULE"
WILDCARDS_VAR = "GPU_CACHE_WILDCARDS"
GPU_TYPE_VAR = "GPU_CACHE_GPU_TYPE"
RUN_ID_VAR = "GPU_CACHE_RUN_ID"
JAX_CACHE_DIR_VAR = "JAX_COMPILATION_CACHE_DIR"
TRITON_CACHE_DIR_VAR = "TRITON_CACHE_DIR"
TRITON_MANAGER_VAR = "TRITON_CACHE_MANAGER"
INDUCTOR_CACHE_DIR_VAR = "TORCHINDUCTOR_CACHE_DIR"
TORCH_EXTENSIONS_DIR_VAR = "TORCH_EXTENSIONS_DIR"
CUDA_CACHE_PATH_VAR = "CUDA_CACHE_PATH"
NODE = "node"
CLUSTER = "cluster"
XLA_AUTOTUNE_CACHE = "xla_gpu_per_fusion_autotune_cache_dir"
NODE_LOCAL_PREFIX = "gpu-cache-"
TEMP_PREFIX = ".gpu-cache-tmp."
TRIM_STAMP = ".gpu-cache-trim"
TRIM_LOCK = ".gpu-cache-trim.lock"
STATE_FOLDER = "state"
SET_ASIDE_PREFIX = "set-aside-"
SET_ASIDE_SEEN = ".gpu-cache-set-aside."

#: The modules whose caches this hook observes, each with its kind, whose piece is
#: ``kinds.<kind>``: with the pieces found in ``kinds/`` (``_found``), a copy of
#: gpu_cache.core.kinds.WATCHED_MODULES (a test fails when they drift).
_WATCHED = {"jax": "jax", "triton": "triton", "torch._inductor.codecache": "inductor",
            "jax_triton.triton_lib": "jax_triton"}
#: The kinds' pieces that watch no module of their own: no need to look in them.
_NOT_FOUND = ("tokamax", "ptxas", "bytecode")
#: The first line of the piece of a kind beyond ``_WATCHED``, with the module it watches after it.
_WATCHES = b"# gpu-cache hook piece watching "
#: The package of the pieces, beside this file.
_PACKAGE = "gpu_cache_hook"
#: The other modules the Inductor piece needs before it wraps anything (issue 31).
_INDUCTOR_TOO = ("torch._functorch._aot_autograd.autograd_cache", "torch._inductor.compile_fx")
#: jax-triton's module whose kernels its piece keeps (issue 34), where JAX_TRITON_VAR is set.
_JAX_TRITON_MODULE = "jax_triton.triton_lib"
#: The import after which the tokamax fix runs (TOKAMAX_FIX_VAR switches it off).
_TOKAMAX_MODULE = "tokamax._src.ops.op"
#: The import after which the ptxas piece marks jaxlib's Triton kernels for the shim (issue 37).
_PTXAS_MODULE = "jax_triton"
#: The import after which the tier copies Inductor's shared files in (issue 23).
_INDUCTOR_MODULE = "torch._inductor"
#: The tiered kinds (a copy of gpu_cache.core.kinds.TIERED) and the variables of the kinds'
#: node-local fallback folders that ``_guard`` judges here (Triton's and the locks' are judged
#: where they are used: ``_usable_triton_folder``, ``_install``); a test fails when they drift.
_TIERED = ("jax", "triton", "inductor", "jax_triton")
_NODE_LOCAL_VARS = (INDUCTOR_CACHE_DIR_VAR, BYTECODE_VAR, CUDA_CACHE_PATH_VAR, RECORDS_VAR, JAX_TRITON_VAR)
_OFF = ("0", "off", "false", "no")

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
        self.libraries = set()  # the watched libraries this process imported
        self.parts = {}  # what goes into the record: "jax", "triton", "tokamax", "fallbacks"
        self.tokamax_fix = True  # not switched off
        self.triton_cache_dir = None  # TRITON_CACHE_DIR at start (jax-triton clears it)
        self.ptxas_tally = None  # the file the ptxas shim's calls are counted in (issue 34)
        self.ptxas_kernels = None  # the folder of jaxlib's Triton kernel names for the shim (issue 37)
        self._exit = False

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

    def piece(self, name):
        """The hook's module ``name`` (see ``_piece``)."""
        return _piece(name)

    def observed(self, name):
        """A watched library was imported: the record is written at exit (the exit handler is
        registered only now, so a process without jax or triton loads nothing for it)."""
        self.libraries.add(name)
        if self.folder and not self._exit and not _compile_worker():  # (its parent writes one)
            import atexit

            self._exit = True
            atexit.register(self._write_record)

    def _write_record(self):
        try:
            _piece("records").write(self)
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


def _piece(name):
    """The hook's module ``gpu_cache_hook.<name>``, from this file's folder: the package is
    loaded from there, not from whatever ``sys.path`` finds first (the job may have changed it
    by exit), never another checkout's of another version; its modules then come from it."""
    full = f"{_PACKAGE}.{name}"
    module = sys.modules.get(full)
    if module is not None:
        return module
    if _PACKAGE not in sys.modules:
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
    __import__(full)
    return sys.modules[full]


def _compile_worker():
    """Whether this is one of Inductor's compile workers (up to 32 per process, started from
    this script, and the process that starts them): they leave the tier's copy-in of
    Inductor's files, single-flight of graphs and the record to the process that started them
    (a record of theirs would count one more process that compiled nothing, written while that
    process waits for them to exit)."""
    argv = getattr(sys, "argv", None) or [""]
    return os.path.basename(os.path.dirname(str(argv[0]))) == "compile_worker"


def _found():
    """``{module: kind}`` of each piece in ``kinds/`` of a kind beyond ``_WATCHED``
    (``kinds/<kind>.py``, or ``kinds/<kind>/__init__.py``, whose first line says the module it
    watches): a new kind's piece needs no line here. One listing of ``kinds/``, then a read of
    the head of each new piece."""
    folder = os.path.join(os.path.dirname(_HERE or ""), _PACKAGE, "kinds")
    known = set(_WATCHED.values()).union(_NOT_FOUND)
    found = {}
    for name in os.listdir(folder):
        kind = name[:-3] if name.endswith(".py") else name
        if kind in known or kind.startswith("_") or not kind.isidentifier():
            continue
        path = os.path.join(folder, name)
        if not name.endswith(".py"):
            path = os.path.join(path, "__init__.py")
        try:
            head = _read_small(path, 200).split(b"\n", 1)[0]
        except OSError:  # not a piece (a folder without one, a cache folder)
            continue
        if head.startswith(_WATCHES):
            found[head[len(_WATCHES):].decode("ascii").strip()] = kind
    return found


def _observe(library):
    def handler(module):
        if library == "inductor" and _compile_worker():
            return
        _HOOK.observed(library)
        _piece(f"kinds.{library}").on_import(module, _HOOK)

    return handler


def _inductor(module):
    if _compile_worker():
        return
    tier = _piece("common").tier(_HOOK)
    if tier is not None:
        _HOOK.parts.setdefault("inductor", {})
        tier.fetch_tree("inductor")


def _ptxas_kernels(module):
    _piece("kinds.ptxas.piece").on_jax_triton(module, _HOOK)


def _tokamax(module):
    _piece("kinds.tokamax").on_import(module, _HOOK)


def _tokamax_package(module):
    _piece("kinds.tokamax").on_package(module, _HOOK)


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


def _usable_triton_folder():
    """Point Triton at another folder when the exported one cannot be created: Triton creates
    it at start and raises in a read-only container image where the cache root is not bound.
    Costs one stat where the folder exists; the fallback (a trusted node-local folder, else a
    private one) is in ``trust``, as is the check of a node-local folder
    that ``gpu-cache env`` exported."""
    folder = os.environ.get(TRITON_CACHE_DIR_VAR)
    if folder and _node_local(folder):
        _piece("trust").triton_node_local(folder, _HOOK, _stderr)
        return
    if not folder or os.path.isdir(folder):
        return
    try:
        os.makedirs(folder, exist_ok=True)
        return
    except OSError as exc:
        why = exc.strerror or repr(exc)
    _piece("trust").triton(folder, why, _HOOK, _stderr)


def _bytecode_cache():
    """With gpu-cache's bytecode cache on, this process's bytecode goes to a folder of its
    interpreter and image (``kinds.bytecode``)."""
    folder = os.environ.get(BYTECODE_VAR)
    if folder and os.path.isabs(folder):
        _piece("kinds.bytecode").install(folder)


def _guard():
    """A node-local tier or fallback folder this job was given is judged on this node before
    any tool reads it: ``gpu-cache env`` checked it where it ran, but another user may have
    made it here first (``trust.guard``). Costs a few string tests when the
    job has none."""
    tier = os.environ.get(TIER_VAR, "")
    tier = os.path.normpath(tier) if os.path.isabs(tier) and os.path.isabs(
        os.environ.get(SHARED_VAR, "")) else ""
    names = [n for n in _NODE_LOCAL_VARS if _node_local(os.environ.get(n) or "")
             and not (tier and os.environ[n].startswith(tier + os.sep))]
    if tier or names:
        _piece("trust").guard(tier, _TIERED, names, _HOOK, _stderr)


def _install():
    try:
        _guard()
    except Exception as exc:  # the tier is not used then: nothing unjudged is read
        os.environ[TIER_VAR] = ""
        _HOOK.warn("judging the node-local folders", exc)
    for name, step in (("triton fallback", _usable_triton_folder), ("bytecode cache", _bytecode_cache)):
        try:
            step()
        except Exception as exc:  # that cache is off; the rest of the hook still works
            _HOOK.warn(name, exc, off=True)
    _HOOK.triton_cache_dir = os.environ.get(TRITON_CACHE_DIR_VAR)
    folder = os.environ.get(RECORDS_VAR) or None
    locks = os.environ.get(LOCKS_VAR)
    _HOOK.flight = bool(locks) and os.path.isabs(locks)
    if _HOOK.flight and _node_local(locks):
        try:
            _HOOK.flight = _piece("trust").locks_node_local(locks, _HOOK, _stderr)
        except Exception as exc:
            _HOOK.flight = False
            _HOOK.warn("single-flight's node-local folder", exc)
    # An older copy of this hook (before the marker) that ran first watches and records
    # already: a second watcher would only write a second record.
    if folder and any(type(finder).__name__ == _LEGACY_WATCHER for finder in sys.meta_path):
        folder = None
    _HOOK.folder = folder
    if os.path.isabs(os.environ.get(PTXAS_VAR, "")):  # issue 34: before jaxlib loads
        try:
            _piece("kinds.ptxas.piece").install(_HOOK)
        except Exception as exc:
            _HOOK.warn("ptxas cache", exc, off=True)
    tier, shared = os.environ.get(TIER_VAR, ""), os.environ.get(SHARED_VAR, "")
    _HOOK.tier = os.path.isabs(tier) and os.path.isabs(shared)
    watch = folder or _HOOK.flight or _HOOK.tier
    handlers = {}
    if watch:
        try:
            watched = {**_WATCHED, **_found()}
        except Exception as exc:  # the kinds listed here are still watched
            watched = _WATCHED
            _HOOK.warn("finding the pieces of other kinds", exc)
        handlers = {name: _observe(kind) for name, kind in watched.items()}
        handlers.update((name, _observe("inductor")) for name in _INDUCTOR_TOO)
    if os.path.isabs(os.environ.get(JAX_TRITON_VAR, "")):  # its kernel cache, records or not
        handlers[_JAX_TRITON_MODULE] = _observe("jax_triton")
    if _HOOK.ptxas_kernels:  # the shim is on: it caches jaxlib's kernels, not XLA's
        handlers[_PTXAS_MODULE] = _ptxas_kernels
    if _HOOK.tier:  # issue 23: Inductor's files through the tier too
        handlers[_INDUCTOR_MODULE] = _inductor
    _HOOK.tokamax_fix = os.environ.get(TOKAMAX_FIX_VAR, "").strip().lower() not in _OFF
    if _HOOK.tokamax_fix or folder:  # switched off, the record says so
        handlers[_TOKAMAX_MODULE] = _tokamax
    if os.path.isabs(os.environ.get(AUTOTUNE_VAR, "")):  # issue 24
        handlers["tokamax"] = _tokamax_package
    sys.meta_path.insert(0, _Watcher(handlers))


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
