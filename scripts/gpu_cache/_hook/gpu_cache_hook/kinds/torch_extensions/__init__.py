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
- **keyed whole-folder entries** (``builds``, the hook's keyed build folders):
  ``<folder>/<name>-<key>``, the key a digest of what torch builds from and of what its own hash
  leaves out: the extension's name (with torch's
  in-process version suffix), the sources' contents, every flag and option and the response
  files they name (``flags``), torch's build, the compiler and its search paths
  (:data:`COMPILER_VARS`), Python's ABI and the machine, what the compiler makes of a
  ``-march=native`` on this CPU (``flags.NATIVE``) and, for CUDA, the CUDA root and target
  architectures. A build runs in the folder handed out and is renamed into place whole with
  its manifest (``builds.MANIFEST``; the headers it included outside torch); a build that read a
  file changed since its key was taken is not kept. An entry is served only whole; else the
  process builds (a changed header: a new entry replaces the stale one);
- **single-flight with leases** (``flight``, kind ``torch_extensions``): one process
  builds a key, the others wait for its entry; a dead builder's lock frees them at once (the
  kernel drops a ``flock``), its lease across nodes once stale. No ``FileBaton`` is taken;
- **the record's part** (:func:`section`): hits, misses (each with its key parts and why), the
  build seconds and those the hits saved.

A torch whose functions lack :data:`API`'s parameters is left untouched (the record says so).
Standard library only, Python 3.9+.
"""

import os
import sys
import threading

from ... import builds, common
from ...common import text
from ...names import TORCH_EXTENSIONS_DIR_VAR
from . import flags

KIND = "torch_extensions"
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

_MUTEX = threading.Lock()
_ASKED = {}  # (compiler command, arguments) -> what it printed


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
                return builds.hand_out(KIND, os.path.normpath(folder), name, part(hook), hook)
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
        return build.serve(part(hook))

    _jit_compile.__wrapped__, _get_build_directory.__wrapped__ = original, handed_out
    module._jit_compile, module._get_build_directory = _jit_compile, _get_build_directory


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


def _asked(command, *args):
    """What compiler ``command`` prints for ``args``, asked once per process within a deadline."""
    import subprocess

    with _MUTEX:
        known = _ASKED.get((command, args))
    if known is None:
        known = subprocess.run([command, *args], capture_output=True, timeout=builds.HELPER_TIMEOUT,
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


class _Build(builds.KeyedBuild):
    """One ``_jit_compile`` call into gpu-cache's folder: its key, torch's build and load."""

    kind = KIND
    keeps = ("build.ninja",)

    @classmethod
    def of(cls, module, original, args, kwargs, hook):
        """The build of one call, or None where its folder is not one this piece handed out
        (a ``build_directory`` of the caller's own)."""
        import inspect

        call = inspect.signature(original).bind(*args, **kwargs)
        call.apply_defaults()
        given = call.arguments
        ours, team = builds.handed(str(given["build_directory"]))
        return cls(module, given, team, hook) if ours else None

    def __init__(self, module, given, team, hook):
        super().__init__(os.path.normpath(str(given["build_directory"])), team, hook)
        self.module, self.given = module, given
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
        name = given["name"] if version == 0 else f"{given['name']}_v{version}"
        self.keyed(name, {**parts, "name": name})

    def _parts(self):
        """The key parts, each text (``doctor --explain`` names the one that changed)."""
        import hashlib
        import json

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
        parts = {"sources": sources.hexdigest()[:builds.KEY_LENGTH], "flags": json.dumps(options),
                 "torch": _torch(), "compiler": _compiler(self.module),
                 "paths": json.dumps(paths, sort_keys=True), "python": python, "cuda": cuda}

        def macros(native):  # what the compiler defines with them here
            return _asked(self.module.get_cxx_compiler(), *native, "-x", "c++", "-E", "-dM", os.devnull)

        # (the compiler runs in the folder handed out: a relative response file is there)
        found, self.responses = flags.parts(options[:4], self.temp, macros, builds.KEY_LENGTH)
        return {**parts, **found}

    # --- torch's part of a keyed build ---------------------------------------------------------

    def build(self):
        given = self.given
        self.module._write_ninja_file_and_build_library(
            name=self.name, sources=self.sources, extra_cflags=given["extra_cflags"] or [],
            extra_cuda_cflags=given["extra_cuda_cflags"] or [],
            extra_sycl_cflags=given["extra_sycl_cflags"] or [],
            extra_ldflags=given["extra_ldflags"] or [],
            extra_include_paths=given["extra_include_paths"] or [],
            build_directory=self.temp, verbose=given["verbose"],
            with_cuda=self.with_cuda, with_sycl=self.with_sycl, is_standalone=given["is_standalone"])

    def load(self, where):
        if self.given["is_standalone"]:
            return self.module._get_exec_path(self.name, where)
        return self.module._import_module_from_library(self.name, where, self.given["is_python_module"])

    def library(self):
        if self.given["is_standalone"]:
            return os.path.basename(self.module._get_exec_path(self.name, self.temp))
        return f"{self.name}{self.module.LIB_EXT}"

    def inputs(self):
        """The sources and the response files their flags name (load_inline's, in the folder
        handed out, are its own)."""
        return self.sources + self.responses

    def headers(self):
        """What the build included outside torch's installation (its version is in the key) and
        besides the sources (their contents are)."""
        torch_root = os.path.dirname(os.path.abspath(sys.modules["torch"].__file__)) + os.sep
        skip = {os.path.abspath(s) for s in self.sources}
        return builds.ninja_headers(self.temp, skip, torch_root, self.since)


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
