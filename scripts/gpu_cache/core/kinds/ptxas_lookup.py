"""Which ptxas the jobs' XLA and jaxlib will run, and whether the ptxas shim comes first
(issue 34; the ptxas kind's part of ``gpu-cache doctor``: :meth:`Kind.doctor_report`).

Read from the sources (XLA's ``FindCudaExecutable``, jaxlib's ``GetModuleImage``, JAX's
``_cuda_path``): XLA's own kernels take ``<xla_gpu_cuda_data_dir>/bin/ptxas`` first, which JAX
fills from ``$CUDA_ROOT``, else from its CUDA wheel (``nvidia.cu13``, else ``nvidia.cuda_nvcc``,
where it holds ``bin/ptxas``), then each ``PATH`` entry, then ``/usr/local/cuda`` and
``/opt/cuda`` and the wheel; jaxlib's Triton kernels take ``bin/ptxas`` under the working
folder, then ``PATH``, then the same roots. Each candidate must answer ``--version`` (XLA also
passes over releases before 11.8 and 12.3.103). This answers for the Python running gpu-cache
(a container job's image may hold another) and the current environment.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from gpu_cache._hook.gpu_cache_hook.kinds.ptxas import shim

#: The oldest ptxas XLA runs, and the one release it passes over.
OLDEST = (11, 8, 0)
EXCLUDED = ((12, 3, 103),)
_VERSION_RE = re.compile(rb"\bV(\d+)\.(\d+)\.(\d+)\b")


def version(path: str) -> tuple[tuple[int, int, int] | None, str]:
    """``(version, its line)`` of what ``path --version`` prints; (None, why) where it fails."""
    try:
        done = subprocess.run([path, "--version"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"--version failed: {exc}"
    found = _VERSION_RE.search(done.stdout)
    if done.returncode != 0 or found is None:
        return None, f"--version answered {done.returncode} without a version"
    line = next((x for x in done.stdout.decode("utf-8", "replace").splitlines() if "release" in x), "")
    return (int(found[1]), int(found[2]), int(found[3])), line.strip()


def jax_cuda_root(environ: dict[str, str]) -> tuple[str | None, str]:
    """``(JAX's CUDA root, where it comes from)``, as jax 0.11 finds it in this Python."""
    if environ.get("CUDA_ROOT") is not None:
        return environ["CUDA_ROOT"], "$CUDA_ROOT"
    for module in ("nvidia.cu13", "nvidia.cuda_nvcc"):
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            continue
        for place in spec.submodule_search_locations or []:
            if (Path(place) / "bin" / "ptxas").exists():
                return place, f"JAX's CUDA wheel ({module})"
        return None, f"JAX's CUDA wheel ({module}) holds no bin/ptxas"
    return None, "no $CUDA_ROOT and no CUDA wheel"


def lookup(candidates: list[tuple[str, str]], shim: ModuleType, real: str | None,
           xla: bool) -> dict[str, Any]:
    """The first candidate ``(path, where)`` that answers ``--version`` (for XLA, of a release it
    takes): what runs, from where, and whether it is the shim (then ``real`` runs behind it)."""
    for path, where in candidates:
        if not shim.runnable(path):
            continue
        is_shim = shim.is_shim(path)
        behind = real if is_shim else path
        if behind is None:
            continue
        found, line = version(behind)
        if found is None or (xla and (found < OLDEST or found in EXCLUDED)):
            continue
        return {"runs": path, "found_in": where, "shim": is_shim, "real": behind, "version": line}
    return {"runs": None, "found_in": None, "shim": False, "real": None, "version": None}


def report(variable: str, exports_values: dict[str, str], environ: dict[str, str] | None = None
           ) -> dict[str, Any]:
    """What the jobs' XLA and jaxlib run (with the shim where the startup hook puts it);
    ``variable``: the ptxas kind's, which names its cache folder."""
    environ = dict(os.environ if environ is None else environ)
    folder = exports_values.get(variable) or environ.get(variable)
    path_value = environ.get("PATH", os.defpath)
    real, real_where = shim.find_real(path_value, sys.path)
    jax_triton = importlib.util.find_spec("jax_triton") is not None
    why = (None if folder and jax_triton and real else
           "the ptxas cache is off" if not folder else
           "jax_triton is not installed here: the hook leaves ptxas alone" if not jax_triton else
           "no real ptxas on PATH, in /usr/local/cuda, /opt/cuda or a CUDA wheel")
    job_path = [shim.SHIM_DIR] if why is None else []
    job_path += [p for p in path_value.split(os.pathsep) if os.path.isabs(p)]
    roots = [os.path.join(r, "bin", "ptxas") for r in shim.CUDA_ROOTS]
    on_path = [(os.path.join(p, "ptxas"), "PATH") for p in job_path]
    after = [(p, os.path.dirname(os.path.dirname(p))) for p in roots]
    after += [(os.path.join(os.path.abspath(entry or "."), *parts, "bin", "ptxas"), "a CUDA wheel")
              for entry in sys.path for parts in shim.WHEEL_ROOTS]
    root, root_where = jax_cuda_root(environ)
    xla_first = [(os.path.join(root, "bin", "ptxas"), root_where)] if root else []
    return {
        "cache": folder or None, "shim": shim.FRONT, "shim_first": why is None, "why_not": why,
        "real": real, "real_found_in": real_where, "jax_cuda_root": root, "jax_cuda_root_from": root_where,
        "jaxlib": lookup([(os.path.abspath("bin/ptxas"), "the working folder"), *on_path, *after],
                         shim, real, xla=False),
        "xla": lookup([*xla_first, *on_path, *after], shim, real, xla=True),
    }


def render(info: dict[str, Any]) -> list[str]:
    """Doctor's lines for :func:`report`."""
    if info["shim_first"]:
        head = (f"first on PATH in job processes (cache {info['cache']}; the real ptxas: {info['real']}, "
                f"from {info['real_found_in']})")
    else:
        head = f"not used ({info['why_not']})"
    lines = [f"ptxas shim: {head}"]
    for who, what in (("jaxlib (jax-triton kernels)", info["jaxlib"]),
                      ("XLA (its own kernels)", info["xla"])):
        if what["runs"] is None:
            lines.append(f"  {who}: finds no ptxas")
            continue
        runs = f"the shim, which runs {what['real']}" if what["shim"] else what["runs"]
        where = what["found_in"]
        if who.startswith("XLA") and where == "PATH":
            where = f"PATH: JAX's CUDA root has none ({info['jax_cuda_root_from']})"
        lines.append(f"  {who}: {runs} ({what['version'] or '?'}; from {where})")
    if info["xla"]["shim"]:
        lines.append("  (the shim's /bin/sh front passes XLA's own calls to the real ptxas without starting "
                     "Python or caching: only kernels jaxlib's Triton path makes in the process are cached)")
    return lines
