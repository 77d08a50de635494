"""Carry a warmed cache to another machine, path or image: ``gpu-cache pack`` and ``unpack``.

**The archive** is a tar file (``.tar``, or compressed: ``.tar.gz``/``.tgz``, ``.tar.xz``/``.txz``,
``.tar.bz2``/``.tbz2``), written by :func:`pack` in the POSIX (PAX) format so that file times
keep their fractions of a second. Its first member is :data:`MANIFEST_NAME`, a JSON object
(format :data:`FORMAT`, version :data:`FORMAT_VERSION`; what unpack reads of it is
:data:`SCHEMA`) that says what the rest is:

* ``kinds``: per carried kind (:data:`gpu_cache.core.kinds.CARRIED`: jax, triton, inductor,
  autotune, jax_triton) its entries (:class:`ManifestEntry`), each with ``key``, ``name``
  (the computation, kernel or device kind), ``files`` (file name -> bytes), ``sha256`` (file
  name -> digest), ``size``,
  ``last_use`` and, for Triton, the ``target`` it was compiled for (``sm_90``, from the
  kernel's metadata json), for an autotuning result its ``tokamax`` and ``jax`` versions, and
  ``warm`` where a warm process compiled its bytes (an outputs reference of the root names
  them: unpack keeps that proof, docs/outputs.md);
* ``software``: the identity (:func:`gpu_cache.core.software.identity`) of the interpreter that
  warmed the entries: from the stats hook's records of the warm and validate passes that
  wrote or hit them, else the packing interpreter's; ``software_by_kind``: every distinct one
  per kind, newest first (autotuning results: the versions they name themselves);
* ``device``: the GPU type and device name of those passes, and the Triton targets;
* ``selection`` (the kinds, ``--gpu-type``, ``--workload`` asked for), ``skipped`` (broken entries
  left out, with the reason), ``source_root``, ``created``, ``gpu_cache_version``.

Then one regular-file member per file of each entry, entry after entry: ``jax/<key>-cache``
(and ``jax/<key>-atime`` where JAX kept one; older jax: ``jax/<key>``),
``triton/<key>/<file>``, ``autotune/<version folder>/<device kind>.json`` and
``jax_triton/<key>``. Nothing else: no folders, links or devices.

**Unpack** reads the manifest first and refuses (:class:`Refused`, exit 1) before it writes
anything: a manifest that does not fit the target it is told (software, GPU type), a member
that is not a regular file or not named by the manifest, a size that differs from the
manifest's, more bytes than the disk holds. A manifest it cannot read (wrong types, numbers
out of range) is bad input (exit 2). Then it writes every entry whole, and checks it before it
is put in place (its files' digests, a JAX executable decompressed, a Triton group naming only
files of its entry, an autotuning result gpu-cache's wrapper of its key's versions and device
kind): a JAX file through a temporary file and a rename, with JAX's lock held
where the cache has one; a Triton key folder built in a temporary folder with its group file's
absolute paths rewritten to the new root, then renamed into place; an autotuning result through
a temporary file in its version folder and a rename, under the lock the startup hook saves
under. An entry whose files are not what was packed is :attr:`UnpackReport.damaged`: never
written, the entry already there kept (a dry run reads every file to find them). An entry
already there with a newer (or the same) last use is kept; an older or broken one is replaced.
Files keep their modification times, and JAX's ``-atime`` its content, so the
least-recently-used order survives.
"""

from gpu_cache.core.kinds import CARRIED

from ._archive import open_archive
from ._choose import workload_matcher
from ._fit import fit_problems, target_of_gpu_type, target_software
from ._format import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_NAME,
    SCHEMA,
    ManifestEntry,
    Refused,
    parse_manifest,
    read_manifest,
)
from ._pack import PackReport, check_kinds, pack, render_pack
from ._unpack import UnpackReport, render_unpack, unpack

__all__ = [
    "CARRIED",
    "FORMAT",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "SCHEMA",
    "ManifestEntry",
    "PackReport",
    "Refused",
    "UnpackReport",
    "check_kinds",
    "fit_problems",
    "open_archive",
    "pack",
    "parse_manifest",
    "read_manifest",
    "render_pack",
    "render_unpack",
    "target_of_gpu_type",
    "target_software",
    "unpack",
    "workload_matcher",
]
