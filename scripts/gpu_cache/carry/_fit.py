"""Which target an archive must fit: the software of the jobs' Python or image, and the GPU type."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gpu_cache.core import software
from gpu_cache.core.errors import UsageError
from gpu_cache.core.kinds import Kind

from ._format import printable

#: Compute capability of each GPU type name (as :func:`gpu_cache.core.device.gpu_type_of` names
#: them), to tell whether Triton entries built for a target serve a GPU type.
COMPUTE_CAPABILITY = {
    "v100": 70, "t4": 75, "a100": 80, "a800": 80, "a30": 80, "a10": 86, "a16": 86, "a40": 86,
    "rtxa6000": 86, "rtx3090": 86, "rtx3090ti": 86, "rtx3080": 86, "l4": 89, "l40": 89, "l40s": 89,
    "rtx4090": 89, "rtx6000ada": 89,
    "h100": 90, "h200": 90, "h800": 90, "h20": 90, "gh200": 90, "b100": 100, "b200": 100,
    "gb200": 100, "b300": 103, "rtx5090": 120, "rtxpro6000blackwell": 120, "rtxpro4500blackwell": 120,
}


def target_of_gpu_type(gpu_type: str) -> str | None:
    """The Triton target of a GPU type (``h200`` -> ``sm_90``); a type written as a target
    (``sm_90``) is itself; None when unknown."""
    if re.fullmatch(r"sm_\d{2,3}", gpu_type):
        return gpu_type
    capability = COMPUTE_CAPABILITY.get(gpu_type.split("-mig")[0])  # a MIG slice: its GPU's
    return f"sm_{capability}" if capability else None


def _identity_code() -> str:
    """Python source that prints the identity of whatever interpreter runs it (gpu_cache's
    software module is standard library only and Python 3.9 compatible)."""
    source = Path(software.__file__).read_text()
    packages = software.key_packages()  # (the hook's, which that interpreter may not have)
    return source + f"\nimport json as _json\nprint(_json.dumps(identity(packages={packages!r})))\n"


def target_software(python: str | None = None, image: str | None = None) -> tuple[dict[str, Any] | None, str]:
    """The identity of the software the entries are for, and that target in words: a named
    Python (run to ask it), an image (run with ``apptainer``/``singularity exec`` where one is
    installed; else None: only its name can be compared), or this interpreter.

    Raises:
        UsageError: the named Python or image cannot be run.
    """
    if python is None and image is None:
        return software.identity(), f"this interpreter ({sys.executable})"
    if python is not None:
        argv, where = [python, "-c", _identity_code()], python
    else:
        assert image is not None
        runner = shutil.which("apptainer") or shutil.which("singularity")
        if runner is None:
            return None, f"image {image}"
        argv, where = [runner, "exec", image, "python3", "-c", _identity_code()], f"image {image}"
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise UsageError(f"cannot run {where} to learn its software: {exc}") from None
    lines = proc.stdout.strip().splitlines()
    try:
        identity = json.loads(lines[-1]) if proc.returncode == 0 and lines else None
    except ValueError:
        identity = None
    if not isinstance(identity, dict):
        why = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        raise UsageError(f"cannot learn the software of {where}: {why}")
    return identity, where


def fit_problems(manifest: Mapping[str, Any], present: Iterable[Kind], target: dict[str, Any] | None,
                 target_words: str, image: str | None, gpu_type: str | None) -> tuple[list[str], list[str]]:
    """(mismatches, notes): why the entries of the ``present`` kinds would not serve the
    target, and what could not be checked. ``manifest``: checked against the format's schema
    (its ``software_by_kind`` lists mappings, its ``device`` sections lists of text)."""
    problems: list[str] = []
    notes: list[str] = []
    by_kind = manifest.get("software_by_kind") or {}
    device = manifest.get("device") or {}
    for kind in present:
        name = kind.name
        warmed = by_kind.get(name) or []
        if not warmed:
            notes.append(f"the archive does not say which software made its {name} entries")
        elif target is not None:
            if all(kind.carry.software_of(w) != kind.carry.software_of(target) for w in warmed):
                made, has = kind.carry.software_words(warmed[0]), kind.carry.software_words(target)
                problems.append(printable(f"its {name} entries were made with {made}, {target_words} "
                                          f"has {has}"))
        elif kind.carry.device is None:  # the entries name only their versions, not an image
            notes.append(f"the software of {target_words} cannot be learned here: {name} entries not "
                         "checked (a job uses only those of its own versions)")
        else:  # an image that cannot be run here: compare its name
            images = {str(w.get("image")) for w in warmed if w.get("image")}
            if not any(image == i or os.path.basename(str(image)) == os.path.basename(i) for i in images):
                made_in = ", ".join(sorted(images)) or "no image (the host)"
                problems.append(printable(f"its {name} entries were made in {made_in}, not {image} (no "
                                          "apptainer here to run the image and compare its software)"))
        if gpu_type is not None and kind.carry.device is not None:  # (None: each names its device)
            _gpu_problems(name, kind.carry.device, device.get(name) or {}, gpu_type, problems, notes)
    return problems, notes


def _gpu_problems(name: str, holds: str, section: Mapping[str, Any], gpu_type: str, problems: list[str],
                  notes: list[str]) -> None:
    """Whether a kind's entries, whose keys hold the device (``holds``: "device") or the
    compute target they were compiled for, serve ``gpu_type``: a problem or a note."""
    if holds == "device":
        types = section.get("gpu_types") or []
        if not types:
            notes.append(f"the archive does not say which device its {name} entries were compiled for")
        elif gpu_type not in types:
            problems.append(printable(
                f"its {name} entries were compiled on {', '.join(types)}, not {gpu_type} (their keys "
                "hold the device; --kind unpacks only the other kinds' entries)"))
        return
    targets = section.get("targets") or []
    wanted = target_of_gpu_type(gpu_type)
    if not targets:
        notes.append(f"the archive does not say which GPU its {name} entries target")
    elif wanted is None:
        if gpu_type not in (section.get("gpu_types") or []):
            notes.append(printable(f"the compute capability of GPU type {gpu_type} is unknown "
                                   f"here: {name} targets {', '.join(targets)} not checked"))
    elif wanted not in targets:
        problems.append(printable(f"its {name} entries target {', '.join(targets)}, not "
                                  f"{wanted} ({gpu_type})"))
