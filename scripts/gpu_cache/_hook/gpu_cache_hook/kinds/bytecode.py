# gpu-cache hook piece
# start-with GPU_CACHE_BYTECODE
# node-local GPU_CACHE_BYTECODE
"""gpu-cache's startup hook, the bytecode cache: loaded at start only where it is on
(``bytecode_cache: true`` exports ``$GPU_CACHE_BYTECODE``).

This process's bytecode is written and read under ``$GPU_CACHE_BYTECODE/<tag>/``, even where
the image forbids bytecode (``PYTHONDONTWRITEBYTECODE``). Python trusts a ``.pyc`` whose source
has the same mtime and size, which two images with normalised mtimes share, so (issue 21):

- each interpreter and image has a folder of its own: ``<tag>`` hashes the interpreter's path
  and version, the image's name where the container gives one (Apptainer), and the identity
  (inode, size, mtime, ctime) of the interpreter and of each install folder on ``sys.path``
  (the standard library, site-packages): another image (Docker, Podman, enroot: another tree
  of files) has other ones, and an image rebuilt in place gets new ones;
- the ``.pyc`` files are checked hash-based ones (PEP 552): each import compares the hash of
  the source with the one in the ``.pyc``, so no ``.pyc`` ever runs for other source, e.g. an
  application's own module outside the install folders, changed at the same size and mtime.
  Each import reads its source and hashes it; what the cache saves is the compile.

Where the import system lacks what this needs, the kind stays off in the process.
Standard library only, Python 3.9+.
"""

import os
import sys

from ..names import BYTECODE_VAR, IMAGE_VARIABLES

#: PEP 552's flags of a checked hash-based .pyc.
_CHECKED = (0b11).to_bytes(4, "little")


def tag():
    """The name of this interpreter's and image's folder."""
    import zlib

    executable = os.path.realpath(sys.executable or "")
    image = next((os.environ[v] for v in IMAGE_VARIABLES if os.environ.get(v)), "")
    parts = [executable, sys.version, image]
    mine = set(os.environ.get("PYTHONPATH", "").split(os.pathsep))  # the job's, not the image's
    for path in [executable, *(p for p in sys.path if p and p not in mine and os.path.isabs(p))]:
        try:
            info = os.stat(path)
        except OSError:
            continue
        parts.append(f"{path}:{info.st_ino}:{info.st_size}:{info.st_mtime_ns}:{info.st_ctime_ns}")
    identity = "\0".join(parts).encode("utf-8", "surrogateescape")
    return f"{sys.implementation.cache_tag}-{zlib.crc32(identity):08x}"


def _checked_source_loaders(external):
    """Python's file finder hook, with a source loader that writes checked hash-based .pyc."""
    import _imp

    key = external._RAW_MAGIC_NUMBER

    class CheckedSourceFileLoader(external.SourceFileLoader):
        def source_to_code(self, data, path, *, _optimize=-1):
            self._source_hash = _imp.source_hash(key, data)  # of exactly what is compiled
            return super().source_to_code(data, path, _optimize=_optimize)

        def _cache_bytecode(self, source_path, bytecode_path, data):
            digest = self.__dict__.pop("_source_hash", None)
            if digest is not None and data[4:8] == bytes(4):  # a timestamp .pyc: make it checked
                data = data[:4] + _CHECKED + digest + data[16:]
            return super()._cache_bytecode(source_path, bytecode_path, data)

    loaders = [(CheckedSourceFileLoader if cls is external.SourceFileLoader else cls, suffixes)
               for cls, suffixes in external._get_supported_file_loaders()]
    return external.FileFinder.path_hook(*loaders)


def start(hook):
    """At start, with ``$GPU_CACHE_BYTECODE``: this process's bytecode goes to a folder of its
    interpreter and image."""
    install(os.environ[BYTECODE_VAR])


def install(folder):
    """Turn the bytecode cache on in this process, under ``folder``."""
    external = sys.modules["_frozen_importlib_external"]
    finder = external.FileFinder
    hook = _checked_source_loaders(external)
    at = next(i for i, h in enumerate(sys.path_hooks) if h.__name__ == "path_hook_for_FileFinder")
    sys.path_hooks[at] = hook
    for path, cached in list(sys.path_importer_cache.items()):
        if isinstance(cached, finder):  # made with the plain loader: made again on next use
            del sys.path_importer_cache[path]
    sys.pycache_prefix = os.path.join(folder, tag())
    sys.dont_write_bytecode = False
