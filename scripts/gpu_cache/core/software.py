"""The software identity of a process: what decides whether a cache warmed by one process
can serve another (cache keys include the jax/jaxlib and triton versions, the Python ABI,
the CUDA driver), and where it ran (container image, conda environment).

Standard library only, and Python 3.9 compatible: it runs inside the jobs' own software
(a container image or a conda environment) through the workload runner.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import sys
from collections.abc import Mapping
from importlib import metadata

#: Variables that name the container image a process runs in (Apptainer, Singularity): a copy of
#: the hook's names', which tests/test_kinds.py keeps equal (carry runs this file's source alone
#: in another interpreter, an image's, where nothing of gpu-cache can be imported).
IMAGE_VARIABLES = ("APPTAINER_CONTAINER", "SINGULARITY_CONTAINER")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except Exception:  # noqa: BLE001 - a broken distribution's metadata is "not installed"
        return None


@functools.lru_cache(maxsize=1)
def key_packages() -> tuple[str, ...]:
    """Distributions whose versions are part of cache keys or decide whether a cache works:
    those the kinds' hook pieces declare (``software``), which the hook's records keep too.
    (Imported here, not at the top: carry runs this file's source alone, and passes them.)"""
    from gpu_cache._hook.gpu_cache_hook.names import pieces

    return tuple(dict.fromkeys(name for piece in pieces() for name in piece.software))


def key_fields() -> tuple[str, ...]:
    """The identity fields whose difference makes a warmed cache useless to a job: Python, and
    every distribution a kind's piece declares (:func:`key_packages`). Stats, doctor, explain
    and the OCI manifest take the same."""
    return ("python", *key_packages())


def identity(environ: Mapping[str, str] | None = None,
             packages: tuple[str, ...] | None = None) -> dict[str, str | None]:
    """This interpreter's software: Python version and executable, the versions of the key
    ``packages`` (default :func:`key_packages`; None where absent), and the image and conda
    environment it runs in."""
    environ = os.environ if environ is None else environ
    out: dict[str, str | None] = {
        "python": platform.python_version(),
        "executable": sys.executable,
    }
    out.update({name: _version(name) for name in (key_packages() if packages is None else packages)})
    out["image"] = next((environ[v] for v in IMAGE_VARIABLES if environ.get(v)), None)
    out["conda_env"] = environ.get("CONDA_PREFIX") or None
    return out


def minor(version: object) -> str | None:
    """``3.11`` from ``3.11.7``: the Python version whose ABI an entry's code needs."""
    return ".".join(str(version).split(".")[:2]) if version else None


def release(version: object) -> tuple[int, ...]:
    """``(0, 10, 2)`` from ``0.10.2`` (or ``0.10.2rc1``): its leading whole numbers."""
    parts = []
    for piece in str(version or "").split("."):
        digits = re.match(r"\d+", piece)
        if not digits:
            break
        parts.append(int(digits.group()))
    return tuple(parts)


def describe(software: Mapping[str, object]) -> str:
    """A short phrase for messages: ``jax 0.10.2 (Python 3.11.7) in docker://x`` or ``on the
    host``; the image as the config names it (``container``, in verdicts) before the file it
    was pulled to (``image``)."""
    parts = [f"{name} {software[name]}" for name in ("jax", "triton", "torch") if software.get(name)]
    text = ", ".join(parts) or "no jax/triton/torch"
    text += f" (Python {software.get('python') or '?'})"
    where = software.get("container") or software.get("image") or software.get("conda_env")
    return f"{text} in {where}" if where else f"{text} on the host"


def differences(warmed: Mapping[str, object], ran: Mapping[str, object]) -> list[str]:
    """The key fields in which a job's software differs from what warmed the cache; a field
    that one side did not record is not a difference."""
    return [name for name in key_fields()
            if warmed.get(name) and ran.get(name) and warmed.get(name) != ran.get(name)]


def changes(before: Mapping[str, object], now: Mapping[str, object]) -> list[str]:
    """How the identity ``now`` differs from ``before``, field by field in words: ``zstandard
    0.25.0 installed``, ``jax 0.10.1 -> 0.10.2``, ``numba 0.60.0 removed``; any field, not only
    :func:`key_fields` (every one is part of a verdict's inputs)."""
    out = []
    for name in [*now, *(name for name in before if name not in now)]:
        was, found = before.get(name), now.get(name)
        if was == found:
            continue
        if was is None:
            out.append(f"{name} {found} installed" if name not in _PLACES else f"{name} {found}")
        elif found is None:
            out.append(f"{name} {was} removed" if name not in _PLACES else f"no {name} (was {was})")
        else:
            out.append(f"{name} {was} -> {found}")
    return out


#: Identity fields that say where a process ran, not a package.
_PLACES = ("executable", "image", "conda_env")
