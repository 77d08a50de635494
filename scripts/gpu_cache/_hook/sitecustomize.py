"""gpu-cache's startup hook: what every Python process of a job loads, the hook's top floor.

gpu-cache puts this folder first on ``PYTHONPATH``. This file is the loader and the watcher: it
loads the package ``gpu_cache_hook`` beside it and its leaf ``names``, which reads the facts each
kind's piece declares in its first lines; it acts on them at start (the folders judged and
made, the pieces that start), installs an import watcher that loads a piece where a process
imports what the piece serves (issue 19), and runs the user's own ``sitecustomize``. Nothing
imports this file. Rules it keeps:

- standard library only, and nothing but the leaf and the watcher in a process that imports
  no module a piece watches (and, where a piece starts at start, its start);
- never breaks a job: any error is swallowed with at most one warning line on stderr (none
  when stderr is closed), and the job's exit code and output stay as without the hook;
- records nothing without an absolute ``$GPU_CACHE_RECORDS``, and a piece installs nothing
  without it, an absolute ``$GPU_CACHE_LOCKS``, the tier or its own variable;
- one per process: several copies of this file on ``sys.path`` (two checkouts, or one reached
  through a symlink) act as one. The first copy that runs marks the process (an attribute of
  ``sys``); a later copy does nothing; the copies, and older versions of the hook, are skipped
  when the next ``sitecustomize`` is looked for. The package always comes from the folder of
  the copy that runs (never another checkout's, of another version);
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

#: The package of the pieces, beside this file.
_PACKAGE = "gpu_cache_hook"

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
        self.pieces = ()  # the facts of the kinds' pieces beside this file (names.Facts)
        self.loaded = []  # (facts, module) of the pieces this process loaded, in that order
        self._modules = {}  # kind -> its piece's module, once loaded
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

    def module(self, piece):
        """The module of ``piece`` (its facts), loaded on first use from this file's folder."""
        found = self._modules.get(piece.kind)
        if found is None:
            package()
            name = f"{_PACKAGE}.kinds.{piece.kind}"
            __import__(name)
            found = self._modules[piece.kind] = sys.modules[name]
            self.loaded.append((piece, found))
        return found

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
    version: its modules then come from it, by plain imports (relative, within the package)."""
    if _PACKAGE in sys.modules:
        return
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
            _HOOK.module(piece).on_import(module, _HOOK)

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


def _install():
    package()
    from gpu_cache_hook import names, start

    try:
        found = _HOOK.pieces = tuple(names.pieces())
    except Exception as exc:  # no kind's piece then; the records of the hook's own still work
        found = ()
        _HOOK.warn("finding the kinds' pieces", exc)
    _HOOK.flight = start.start(found, _HOOK, _stderr)
    folder = os.environ.get(names.RECORDS_VAR) or None
    # An older copy of this hook (before the marker) that ran first watches and records
    # already: a second watcher would only write a second record.
    if folder and any(type(finder).__name__ == _LEGACY_WATCHER for finder in sys.meta_path):
        folder = None
    _HOOK.folder = folder
    tier, shared = os.environ.get(names.TIER_VAR, ""), os.environ.get(names.SHARED_VAR, "")
    _HOOK.tier = os.path.isabs(tier) and os.path.isabs(shared)
    for piece in found:
        if any(os.path.isabs(os.environ.get(name, "")) for name in piece.start_with):
            try:
                _HOOK.module(piece).start(_HOOK)
            except Exception as exc:
                _HOOK.warn(f"{piece.kind} at start", exc, off=True)
    _HOOK.started = {name: os.environ.get(name) for piece in found for name in piece.makes}
    watching = {}
    for piece in found:
        for name in piece.watched(_HOOK.watching, os.environ):
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


# The hook starts where Python's site runs this file at start-up; imported otherwise (under
# another name, or with -S), it starts nothing.
if __name__ == "sitecustomize" and not sys.flags.no_site:
    _main()
