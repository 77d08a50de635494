# gpu-cache hook piece
# watches torch.utils.cpp_extension
# node-local TORCH_EXTENSIONS_DIR
"""gpu-cache's startup hook, the piece of the ``torch_extensions`` kind: loaded when a process
imports ``torch.utils.cpp_extension``, whose ``load()`` and ``load_inline()`` build C++/CUDA
extensions with ninja into ``$TORCH_EXTENSIONS_DIR/<name>``.

Torch keys such a build by its name alone across processes (ninja rebuilds in place what
changed), and a ``FileBaton`` lock file makes the other processes wait: a builder killed
mid-way leaves the file, and every later job waits on it for ever. With this piece, a build
into gpu-cache's folder (the folder the job got as ``$TORCH_EXTENSIONS_DIR``) goes through
``_jit_compile``'s wrapper instead:

- **a build folder only this user can write**: ``_get_build_directory`` hands torch a new
  folder (``.gpu-cache-tmp.build.*``, 0700) in gpu-cache's folder, never torch's own
  ``<folder>/<name>``, which another account may own and swap the sources in as they compile
  (``load_inline`` writes its sources into the folder it is handed). A kind folder another
  account may write is not built in: the build goes to a private folder of the process;
- **keyed whole-folder entries**: ``<folder>/<name>-<key>``, the key a digest of what torch
  builds from and of what its own hash leaves out: the extension's name (with torch's
  in-process version suffix), the sources' contents, every flag and option and the response
  files they name (``flags``), torch's build, the compiler and its search paths
  (:data:`COMPILER_VARS`), Python's ABI and the machine, what the compiler makes of a
  ``-march=native`` on this CPU (``flags.NATIVE``) and, for CUDA, the CUDA root and target
  architectures. A build runs in the folder handed out and is renamed into place whole with
  its manifest (:data:`MANIFEST`: the key parts, the library's size and SHA-256, and the size,
  mtime and SHA-256 of each header it included outside torch); a build that read a file
  changed since its key was taken is not kept. An entry is served
  only whole: its folder and library this user's (or root's, or the team's) and written by
  nobody else, the library's digest as built, every header as built; else the process builds
  (a changed header: a new entry replaces the stale one);
- **single-flight with leases** (``flight``, kind ``torch_extensions``): one process
  builds a key, the others wait for its entry; a dead builder's lock frees them at once (the
  kernel drops a ``flock``), its lease across nodes once stale. No ``FileBaton`` is taken;
- **the record's part** (:func:`section`): hits, misses (each with its key parts and why), the
  build seconds and those the hits saved.

A torch whose functions lack :data:`API`'s parameters is left untouched (the record says so).
Standard library only, Python 3.9+.
"""

import errno
import hashlib
import json
import os
import stat
import sys
import threading
import time

from ... import common, owners
from ...common import keep, text
from ...names import TEMP_PREFIX, TORCH_EXTENSIONS_DIR_VAR
from . import flags

KIND = "torch_extensions"
#: The file of an entry that says what it is; written last, inside the temporary folder (the
#: host's inventory, gpu_cache.core.kinds.torch_extensions, imports it from here).
MANIFEST = "gpu-cache-build.json"
FORMAT = 1
#: Characters of the key (hex digits of a SHA-256) in an entry's folder name.
KEY_LENGTH = 32
#: Largest manifest read.
MANIFEST_LIMIT = 16 << 20
#: What the piece calls in torch.utils.cpp_extension, with the leading parameters each must have.
API = {
    "_jit_compile": ("name", "sources", "extra_cflags", "extra_cuda_cflags", "extra_sycl_cflags",
                     "extra_ldflags", "extra_include_paths", "build_directory", "verbose", "with_cuda",
                     "with_sycl", "is_python_module", "is_standalone"),
    "_write_ninja_file_and_build_library": (
        "name", "sources", "extra_cflags", "extra_cuda_cflags", "extra_sycl_cflags", "extra_ldflags",
        "extra_include_paths", "build_directory", "verbose", "with_cuda", "with_sycl", "is_standalone"),
    "_import_module_from_library": ("module_name", "path", "is_python_module"),
    "_get_build_directory": ("name", "verbose"),
    "_get_exec_path": ("module_name", "path"),
    "_get_cuda_arch_flags": ("cflags",),
    "get_cxx_compiler": (),
    "_is_cuda_file": ("path",),
    "_is_sycl_file": ("path",),
}
#: Variables the compiler reads that change what it builds and that torch's own hash leaves out:
#: where it finds headers, libraries and its own parts (libfoo 2's headers in another
#: CPLUS_INCLUDE_PATH make another library).
COMPILER_VARS = ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "LIBRARY_PATH", "COMPILER_PATH",
                 "GCC_EXEC_PREFIX", "LD_RUN_PATH")
#: Variables that change what a CUDA build makes besides its flags (nvcc's host compiler, extra
#: flags and include paths).
CUDA_VARS = ("CC", "PYTORCH_NVCC", "TORCH_CUDA_ARCH_LIST", "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS",
             "CUDA_INC_PATH", "CUDNN_HOME", "CUDNN_PATH")
#: How far a file's time may lag ``time.time_ns()``: the kernel stamps files from its coarse
#: clock, a tick behind.
CLOCK_SLACK_NS = 50_000_000
#: Longest a compiler may take to say its version.
VERSION_TIMEOUT = 60.0

_MUTEX = threading.Lock()
_ASKED = {}  # (compiler command, arguments) -> what it printed
_HANDED = {}  # a build folder handed to torch -> the team of the kind folder it is in


def part(hook):
    """The record's ``torch_extensions`` part of this process, made on first use."""
    found = hook.parts.get(KIND)
    if found is None:
        found = hook.parts[KIND] = {
            "state": "on", "hits": 0, "misses": 0, "waited": 0, "compile_seconds": 0.0,
            "saved_seconds": 0.0, "hit_keys": [], "missed": [], "dropped": {"hit_keys": 0, "missed": 0}}
    return found


def on_import(module, hook):
    """Right after ``torch.utils.cpp_extension`` is imported: check the functions the piece
    calls, then wrap ``_get_build_directory`` and ``_jit_compile`` (a node-local folder was
    judged at start: ``node-local``)."""
    hook.observed(KIND)
    stats = part(hook)
    why = _mismatch(module)
    if why is None and module.__dict__.get("IS_HIP_EXTENSION") is not False:
        why = "a ROCm torch (its builds are hipified first), or one that does not say"
    if why:
        stats["state"] = text(f"off: {why}", 300)
        return
    original, handed_out = module._jit_compile, module._get_build_directory

    def _get_build_directory(name, verbose):
        folder = os.environ.get(TORCH_EXTENSIONS_DIR_VAR) or ""
        if os.path.isabs(folder):
            try:
                return _hand_out(os.path.normpath(folder), name, hook)
            except Exception as exc:  # the hook's own fault (no private folder): torch's folder
                hook.warn("torch extensions", exc)
        return handed_out(name, verbose)

    def _jit_compile(*args, **kwargs):
        build = None
        try:
            build = _Build.of(module, original, args, kwargs, hook)
        except Exception as exc:  # the hook's own fault: torch builds as without it
            hook.warn("torch extensions", exc)
        if build is None:
            return original(*args, **kwargs)
        return build.serve()

    _jit_compile.__wrapped__, _get_build_directory.__wrapped__ = original, handed_out
    module._jit_compile, module._get_build_directory = _jit_compile, _get_build_directory


def _hand_out(folder, name, hook):
    """A new folder for one build, that only this user can write, where torch's
    ``load_inline`` writes its sources and the build runs: in the kind's folder ``folder`` where
    nobody else may write that (else a private folder of this process, no cache)."""
    import tempfile

    try:
        common.make_folders(folder)
        info = os.stat(folder)
        team = owners.team_gid(info)
        if team is not None and team != os.getegid() and team not in os.getgroups():
            team = None  # a group this user is not in is no team of theirs
        why = owners.owner_problem(info, team, where=folder) if stat.S_ISDIR(info.st_mode) else "not a folder"
        if why is None:
            temp = tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}build.", dir=folder)
            _HANDED[temp] = team
            return temp
    except OSError as exc:
        why = f"unusable ({exc.strerror})"
    why = text(f"{folder} is {why}", 500)
    part(hook)["refused"] = why
    hook.warn("torch extensions", PermissionError(errno.EPERM, f"{why}: built in a private folder"), off=True)
    from ... import trust

    return trust.private_folder(os.path.join(KIND, name))


def _mismatch(module):
    """Why ``module`` does not fit the piece, or None."""
    import inspect

    for name, params in API.items():
        func = getattr(module, name, None)
        if not callable(func):
            return f"torch.utils.cpp_extension.{name} is missing"
        try:
            found = tuple(inspect.signature(func).parameters)
        except (TypeError, ValueError) as exc:
            return f"torch.utils.cpp_extension.{name}: no signature ({exc})"
        if found[:len(params)] != params:
            return f"torch.utils.cpp_extension.{name}{found[:len(params)]} is not {name}{params}"
    if not (hasattr(module, "JIT_EXTENSION_VERSIONER") and isinstance(getattr(module, "LIB_EXT", None), str)):
        return "torch.utils.cpp_extension has no JIT_EXTENSION_VERSIONER or LIB_EXT"
    return None


def _digest(data):
    return hashlib.sha256(data).hexdigest()


def _file_digest(path):
    """(``fstat``, SHA-256) of the regular file ``path``, read through one descriptor never
    opened through a link or blocking on a FIFO."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        digest = hashlib.sha256()
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            digest.update(chunk)
        return info, digest.hexdigest()
    finally:
        os.close(fd)


def _asked(command, *args):
    """What compiler ``command`` prints for ``args``, asked once per process within a deadline."""
    import subprocess

    with _MUTEX:
        known = _ASKED.get((command, args))
    if known is None:
        known = subprocess.run([command, *args], capture_output=True, timeout=VERSION_TIMEOUT,
                               check=False).stdout.decode("utf-8", "replace")
        with _MUTEX:
            _ASKED[(command, args)] = known
    return known


def _compiler(module):
    """What names the C++ compiler torch runs in a key: the command, the file it runs and its
    version."""
    import shutil

    command = module.get_cxx_compiler()
    path = shutil.which(command)
    real = os.path.realpath(path) if path else command
    return f"{command} = {real} {_asked(command, '-dumpfullversion', '-dumpversion').strip()}"


def _torch():
    torch = sys.modules["torch"]
    version = getattr(torch, "version", None)
    return (f"{torch.__version__} (git {str(getattr(version, 'git_version', ''))[:12]}, "
            f"cuda {getattr(version, 'cuda', None)})")


class _Changed(Exception):
    """A file the build read changed since its key was taken."""


class _Build:
    """One ``_jit_compile`` call into gpu-cache's folder: its key, and how it is served."""

    @classmethod
    def of(cls, module, original, args, kwargs, hook):
        """The build of one call, or None where its folder is not one this piece handed out
        (a ``build_directory`` of the caller's own)."""
        import inspect

        call = inspect.signature(original).bind(*args, **kwargs)
        call.apply_defaults()
        given = call.arguments
        temp = os.path.normpath(str(given["build_directory"]))
        if temp not in _HANDED:
            return None
        return cls(module, given, temp, _HANDED.pop(temp), hook)

    def __init__(self, module, given, temp, team, hook):
        self.module, self.given, self.temp, self.team, self.hook = module, given, temp, team, hook
        self.folder = os.path.dirname(temp)
        # a file the build reads changed from here on was not what the key saw (_kept)
        self.since = time.time_ns() - CLOCK_SLACK_NS
        sources = [str(s) for s in given["sources"]]
        with_cuda, with_sycl = given["with_cuda"], given["with_sycl"]
        if with_cuda is None:
            with_cuda = any(map(module._is_cuda_file, sources))
        if with_sycl is None:
            with_sycl = any(map(module._is_sycl_file, sources))
        self.sources, self.with_cuda, self.with_sycl = sources, with_cuda, with_sycl
        parts = self._parts()  # (what may fail comes before torch's versioner counts this call)
        arguments = [given["extra_cflags"], given["extra_cuda_cflags"], given["extra_ldflags"],
                     given["extra_include_paths"]]
        # torch's own version of the name in this process (a second build of one name: <name>_v1),
        # asked with torch's folder of the name (a new folder for each call is a new version)
        version = module.JIT_EXTENSION_VERSIONER.bump_version_if_changed(
            given["name"], sources, build_arguments=arguments,
            build_directory=os.path.join(self.folder, given["name"]),
            with_cuda=with_cuda, with_sycl=with_sycl, is_python_module=given["is_python_module"],
            is_standalone=given["is_standalone"])
        self.name = given["name"] if version == 0 else f"{given['name']}_v{version}"
        parts["name"] = self.name
        self.key = _digest(json.dumps(parts, sort_keys=True).encode())[:KEY_LENGTH]
        self.parts = {part: _shown(value) for part, value in parts.items()}  # records, manifest
        self.entry_name = f"{self.name}-{self.key}"
        self.entry = os.path.join(self.folder, self.entry_name)

    def _parts(self):
        """The key parts, each text (``doctor --explain`` names the one that changed)."""
        given = self.given
        sources = hashlib.sha256()
        for path in self.sources:
            with open(path, "rb") as stream:
                data = stream.read()
            sources.update(b"%s %d\n" % (os.fsencode(os.path.basename(path)), len(data)) + data)
        options = [[str(f) for f in given[name] or []] for name in (
            "extra_cflags", "extra_cuda_cflags", "extra_sycl_cflags", "extra_ldflags", "extra_include_paths")]
        options.append([bool(self.with_cuda), bool(self.with_sycl), bool(given["is_python_module"]),
                        bool(given["is_standalone"])])
        cuda = ""
        if self.with_cuda:
            arch = self.module._get_cuda_arch_flags(given["extra_cuda_cflags"])
            cuda = " ".join([str(self.module.CUDA_HOME), *map(str, arch),
                             *(f"{n}={os.environ.get(n, '')}" for n in CUDA_VARS)])
        paths = {n: os.environ[n] for n in COMPILER_VARS if n in os.environ}  # (unset is not empty)
        python = f"{sys.implementation.cache_tag}{getattr(sys, 'abiflags', '')} {os.uname().machine}"
        parts = {"sources": sources.hexdigest()[:KEY_LENGTH], "flags": json.dumps(options), "torch": _torch(),
                 "compiler": _compiler(self.module), "paths": json.dumps(paths, sort_keys=True),
                 "python": python, "cuda": cuda}
        def macros(native):  # what the compiler defines with them here
            return _asked(self.module.get_cxx_compiler(), *native, "-x", "c++", "-E", "-dM", os.devnull)

        found, self.responses = flags.parts(options[:4], self.temp, macros, KEY_LENGTH)  # (run in temp)
        return {**parts, **found}

    # --- whole entries -----------------------------------------------------------------------

    def whole(self):
        """The entry's manifest where the entry is whole and this user's, else (None, why)."""
        team = self.team
        try:
            info = os.lstat(self.entry)
        except FileNotFoundError:
            return None, "no entry"
        except OSError as exc:
            return None, text(f"unreadable ({exc})", 300)
        if not stat.S_ISDIR(info.st_mode):
            return None, "not a folder where the entry should be"
        why = owners.owner_problem(info, team, where=self.entry)
        if why:
            return None, f"the entry's folder is not trusted ({why})"
        try:
            manifest = json.loads(_read(os.path.join(self.entry, MANIFEST)))
            library = manifest["library"]
            if manifest.get("format") != FORMAT or manifest.get("key") != self.key or "/" in library:
                return None, "its manifest is not this key's"
            found, digest = _file_digest(os.path.join(self.entry, library))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return None, text(f"not whole ({exc.__class__.__name__}: {exc})", 300)
        why = owners.owner_problem(found, team, where=os.path.join(self.entry, library))
        if why or found.st_size != manifest.get("size") or digest != manifest.get("sha256"):
            return None, f"its library is {why or 'not as built'}"
        changed = _changed_header(manifest.get("headers"))
        if changed:
            return None, text(f"a header it includes changed: {changed}", 300)
        return manifest, None

    def serve(self):
        """Load the entry (a hit), or wait for the process that builds it, or build it."""
        stats = part(self.hook)
        manifest, why = self.whole()
        if manifest is not None:
            loaded = self._hit(manifest, stats)
            if loaded is not None:
                return loaded
            why = "its entry was removed while it was loaded"
        lock = None
        if self.hook.flight:
            def read():
                return self.whole()[0]

            def peek():
                return read() if os.path.isdir(self.entry) else None

            try:
                manifest, lock = common.flight(self.hook).lead(KIND, self.key, self.folder, read, peek)
            except Exception as exc:  # the hook's own fault: built as without single-flight
                self.hook.warn("torch extensions single-flight", exc)
                manifest = None
            loaded = None if manifest is None else self._hit(manifest, stats, waited=True)
            if loaded is not None:
                return loaded
        where = None
        try:
            where = self._build(stats, why)
        finally:
            if lock is not None:
                lock.release(wrote=where == self.entry)
        return self._load(where)

    def _hit(self, manifest, stats, waited=False):
        """The loaded entry, counted as a hit; None where it was removed before it loaded."""
        try:
            loaded = self._load(self.entry)
        except (ImportError, OSError):
            if os.path.isdir(self.entry):
                raise  # it is there: torch's own error, as without the hook
            return None
        stats["hits"] += 1
        stats["waited"] += waited
        saved = manifest.get("build_seconds")
        stats["saved_seconds"] += saved if isinstance(saved, (int, float)) else 0.0
        keep(stats, "hit_keys", text(self.entry_name))
        common.touch(self.entry)  # its last use
        _remove(self.temp)  # (what load_inline wrote there)
        return loaded

    def _load(self, where):
        if self.given["is_standalone"]:
            return self.module._get_exec_path(self.name, where)
        return self.module._import_module_from_library(self.name, where, self.given["is_python_module"])

    # --- a build -------------------------------------------------------------------------------

    def _build(self, stats, why):
        """Build in the folder handed out, then rename it into place whole; the folder the
        library is in. Where gpu-cache cannot keep it, or the build read a file changed since
        the key was taken, the build is loaded from where it was made. A failed build raises as
        torch's."""
        stats["misses"] += 1
        missed = {"name": text(self.name), "key": text(self.entry_name), "parts": self.parts, "why": why}
        keep(stats, "missed", missed)
        began = time.monotonic()
        given = self.given
        try:
            self.module._write_ninja_file_and_build_library(
                name=self.name, sources=self.sources, extra_cflags=given["extra_cflags"] or [],
                extra_cuda_cflags=given["extra_cuda_cflags"] or [],
                extra_sycl_cflags=given["extra_sycl_cflags"] or [],
                extra_ldflags=given["extra_ldflags"] or [],
                extra_include_paths=given["extra_include_paths"] or [],
                build_directory=self.temp, verbose=given["verbose"],
                with_cuda=self.with_cuda, with_sycl=self.with_sycl, is_standalone=given["is_standalone"])
        except BaseException:
            _remove(self.temp)
            raise
        seconds = time.monotonic() - began
        stats["compile_seconds"] += seconds
        try:
            self._seal(seconds)
            self._place(self.temp)
        except _Changed as exc:  # what it compiled may not be what its key names
            missed["not_kept"] = text(str(exc), 300)
            return self.temp
        except Exception as exc:  # loaded from where it is; prune removes it later
            self.hook.warn("torch extensions: a build not kept", exc)
            return self.temp
        return self.entry

    def _seal(self, seconds):
        """Keep the library and the ninja file alone (made unwritable by others whatever the
        umask), then write the manifest. Raises _Changed where a source or header the build
        read changed since the key was taken (its mtime, as ninja judges)."""
        temp, team = self.temp, self.team
        if self.given["is_standalone"]:
            library = os.path.basename(self.module._get_exec_path(self.name, temp))
        else:
            library = f"{self.name}{self.module.LIB_EXT}"
        for path in self.sources + self.responses:  # (load_inline's, in the folder handed out: its own)
            if os.path.dirname(os.path.abspath(path)) != temp and os.stat(path).st_mtime_ns >= self.since:
                raise _Changed(f"{path} changed while it was built")
        headers = _headers(temp, self.sources, self.since)
        for name in os.listdir(temp):
            path = os.path.join(temp, name)
            if name not in (library, "build.ninja"):
                _remove(path)
            else:
                os.chmod(path, os.lstat(path).st_mode & (0o7775 if team is not None else 0o7755))
        os.chmod(temp, common.safe_mode(team, folder=True))
        info, digest = _file_digest(os.path.join(temp, library))
        manifest = {"format": FORMAT, "key": self.key, "name": self.name, "parts": self.parts,
                    "library": library, "size": info.st_size, "sha256": digest, "headers": headers,
                    "build_seconds": round(seconds, 3)}
        fd = os.open(temp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            common.replace_whole(fd, f"{MANIFEST}.tmp", MANIFEST, json.dumps(manifest).encode(),
                                 common.safe_mode(team))
        finally:
            os.close(fd)

    def _place(self, temp):
        """Rename the build into place. Where a whole entry is there already (another process
        built it meanwhile) it stays and the build goes; a stale or broken one is renamed away
        first (a process that loaded it keeps what it mapped)."""
        import secrets

        for _attempt in range(3):
            try:
                os.rename(temp, self.entry)
                return
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
            if self.whole()[0] is not None:
                _remove(temp)
                return
            stale = os.path.join(self.folder, f"{TEMP_PREFIX}{self.entry_name}.stale.{secrets.token_hex(4)}")
            try:
                os.rename(self.entry, stale)
            except FileNotFoundError:
                continue
            _remove(stale)
        raise OSError(errno.EEXIST, "keeps being replaced", self.entry)


def _read(path):
    """The manifest at ``path``, read whole (at most MANIFEST_LIMIT bytes)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MANIFEST_LIMIT:
            raise OSError(errno.EINVAL, "not a manifest", path)
        chunks, size = [], 0
        while size <= MANIFEST_LIMIT:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
        raise OSError(errno.EFBIG, "not a manifest", path)
    finally:
        os.close(fd)


def _shown(value):
    """A key part as records and manifests keep it: whole where short, else its start and a
    digest of the whole (two that differ past the start still differ)."""
    if len(value) <= 500:
        return value
    return f"{value[:400]}... (sha256 {_digest(value.encode('utf-8', 'surrogateescape'))[:16]})"


def _headers(temp, sources, since):
    """``{path: [size, mtime_ns, sha256]}`` of each file the build included (ninja's record of
    the compilers' dependencies) outside torch's installation (its version is in the key) and
    besides the sources (their contents are). Raises _Changed for one changed at ``since`` or
    later: the build may have read it before."""
    import subprocess

    done = subprocess.run(["ninja", "-t", "deps"], cwd=temp, capture_output=True,
                          timeout=VERSION_TIMEOUT, check=True)
    torch_root = os.path.dirname(os.path.abspath(sys.modules["torch"].__file__)) + os.sep
    skip = {os.path.abspath(s) for s in sources}
    out = {}
    for line in done.stdout.decode("utf-8", "surrogateescape").splitlines():
        if not line.startswith("    "):
            continue
        path = os.path.normpath(os.path.join(temp, line.strip()))
        if path in out or path in skip or path.startswith(torch_root):
            continue
        info, digest = _file_digest(path)
        if info.st_mtime_ns >= since:
            raise _Changed(f"{path} changed while it was built")
        out[path] = [info.st_size, info.st_mtime_ns, digest]
    return out


def _changed_header(headers):
    """The first header of a manifest's that is not as the build saw it, or None: a file of
    the same size and mtime is taken as it was (ninja's own rule), another one is read."""
    if not isinstance(headers, dict):
        return "(the manifest lists none)"
    for path, seen in headers.items():
        try:
            size, mtime_ns, digest = seen
            info = os.stat(path)
            if info.st_size == size and info.st_mtime_ns == mtime_ns:
                continue
            if info.st_size == size and _file_digest(path)[1] == digest:
                continue
        except (OSError, TypeError, ValueError):
            pass
        return path
    return None


def _remove(path):
    import shutil

    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        os.unlink(path)


def section(hook):
    """The record's ``torch_extensions`` part at exit, with single-flight's."""
    if KIND not in hook.libraries:
        return None
    stats = dict(part(hook))
    stats["compile_seconds"] = round(stats["compile_seconds"], 3)
    stats["saved_seconds"] = round(stats["saved_seconds"], 3)
    stats["cache_dir"] = text(os.environ.get(TORCH_EXTENSIONS_DIR_VAR) or "") or None
    stats["single_flight"] = common.flight_stats(hook, KIND)
    return stats
