"""Which device a job sees: the GPU model (as a gpu_type name) and how many are visible."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass

#: Words that name the maker or a product line, not the model.
_VENDOR_WORDS = frozenset({"nvidia", "tesla", "geforce", "quadro", "amd", "instinct", "radeon"})
#: Words that name a variant of one model: its memory, form factor or edition. A100-SXM4-40GB
#: and A100 80GB PCIe are one model (a100); RTX PRO 6000 and RTX PRO 4500 are two.
_VARIANT = re.compile(r"\d+gb?|hbm\d*e?|gddr\d*x?|sxm\d*|pcie|nvl|sff|maxq|server|workstation|"
                      r"edition|generation")


@dataclass(frozen=True)
class Device:
    """``name`` as the driver reports it (``NVIDIA H200``), ``gpu_type`` (``h200``), ``count``
    visible, their ``compute_capability`` (``9.0``) and ``driver`` version where ``nvidia-smi``
    says them, and which ones the job was given (``visible_devices``: CUDA_VISIBLE_DEVICES)."""

    name: str
    gpu_type: str
    count: int
    visible_devices: str | None = None
    compute_capability: str | None = None
    driver: str | None = None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def identity(seen: Mapping[str, object]) -> dict[str, object]:
    """What makes a device (``Device.as_dict()``, or a report's copy of it) the same device for
    a cache: its model, compute capability, driver and how many are visible (JAX keys count
    them), never which ones (``visible_devices``): two GPUs of one model share entries and
    verdicts, whichever index SLURM gives a job."""
    return {name: value for name, value in seen.items() if name != "visible_devices"}


def gpu_type_of(product_name: str) -> str:
    """A short, wildcard-safe type name for a GPU product name (as ``nvidia-smi`` and JAX's
    device kind write it): the model's words without the maker's and without those of a
    memory, form-factor or edition variant, joined.

    ``NVIDIA H200`` -> ``h200``, ``NVIDIA A100-SXM4-80GB`` -> ``a100``,
    ``NVIDIA GeForce RTX 4090`` -> ``rtx4090``, ``NVIDIA RTX PRO 6000 Blackwell Server
    Edition`` -> ``rtxpro6000blackwell``, ``NVIDIA RTX 6000 Ada Generation`` -> ``rtx6000ada``.
    A MIG slice is a device of its own (other SMs, another JAX device kind):
    ``NVIDIA A100-SXM4-40GB MIG 1g.5gb`` -> ``a100-mig1g.5gb``.
    """
    text = product_name.lower().replace("max-q", "maxq")
    model, _, mig = text.partition(" mig ")
    words = [w for w in re.split(r"[\s_-]+", model)
             if w and w not in _VENDOR_WORDS and not _VARIANT.fullmatch(w)]
    name = re.sub(r"[^a-z0-9.]", "", "".join(words)) or "gpu"
    profile = re.sub(r"[^a-z0-9.]", "", mig.split()[0]) if mig.split() else ""
    return f"{name}-mig{profile}" if profile else name


def mig_names(listing: str) -> dict[str, str]:
    """The product name of each MIG slice in ``nvidia-smi -L`` output, by its ``MIG-...``
    UUID, as CUDA and JAX name it: ``NVIDIA A100-SXM4-40GB MIG 1g.5gb``."""
    names: dict[str, str] = {}
    parent = None
    for line in listing.splitlines():
        gpu = re.match(r"GPU \d+: (.+?) \(UUID: ", line)
        mig = re.match(r"\s+MIG (\S+)\s+Device\s+\d+: \(UUID: (MIG-[^)\s]+)\)", line)
        if gpu:
            parent = gpu.group(1)
        elif mig and parent:
            names[mig.group(2)] = f"{parent} MIG {mig.group(1)}"
    return names


def _visible_indices(environ: Mapping[str, str]) -> list[str] | None:
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return [part for part in value.split(",") if part.strip() and part.strip() != "-1"]


def _nvidia_smi(*args: str) -> str:
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30,
                          check=True).stdout


def detect(environ: Mapping[str, str] | None = None) -> Device:
    """The device this process would compute on: its first visible NVIDIA GPU, else the CPU.

    Asks ``nvidia-smi`` (which ignores CUDA_VISIBLE_DEVICES, so the visible set is applied
    here; a MIG slice, visible as ``MIG-<uuid>``, is named as CUDA names it), once per
    process, visible set and ``nvidia-smi`` found: the GPUs do not change while a command
    runs, and one command looks several times (the GPU types, the plan, the runner). Never
    raises: without a working ``nvidia-smi`` the device is ``cpu``.
    """
    environ = os.environ if environ is None else environ
    return _detect(environ.get("CUDA_VISIBLE_DEVICES"), shutil.which("nvidia-smi"))


@functools.lru_cache(maxsize=16)
def _detect(visible_text: str | None, smi: str | None) -> Device:
    visible = _visible_indices({} if visible_text is None else {"CUDA_VISIBLE_DEVICES": visible_text})
    found: list[tuple[str, str | None, str | None]] = []  # (name, compute capability, driver)
    if smi and visible != []:
        try:
            rows = _gpu_rows()
            if visible is None:
                found = [row[2:] for row in rows]
            else:
                by_id = {row[0]: row[2:] for row in rows} | {row[1]: row[2:] for row in rows}
                if any(v.strip().startswith("MIG-") for v in visible):
                    parents = {row[2]: row[3:] for row in rows}
                    by_id |= {uuid: (name, *parents.get(name.split(" MIG ")[0], (None, None)))
                              for uuid, name in mig_names(_nvidia_smi("-L")).items()}
                found = [by_id[v.strip()] for v in visible if v.strip() in by_id]
        except (OSError, subprocess.SubprocessError, IndexError):
            found = []
    if not found:
        return Device(name="cpu", gpu_type="cpu", count=0, visible_devices=visible_text)
    name, capability, driver = found[0]
    return Device(name=name, gpu_type=gpu_type_of(name), count=len(found), visible_devices=visible_text,
                  compute_capability=capability, driver=driver)


def _gpu_rows() -> list[tuple[str, str, str, str | None, str | None]]:
    """``(index, uuid, name, compute capability, driver)`` of each GPU ``nvidia-smi`` lists; a
    driver too old to report ``compute_cap`` gives None for both (the name is still known)."""
    try:
        out = _nvidia_smi("--query-gpu=index,uuid,compute_cap,driver_version,name", "--format=csv,noheader")
        rows = [[c.strip() for c in line.split(",", 4)] for line in out.splitlines() if line.strip()]
        return [(row[0], row[1], row[4], row[2] or None, row[3] or None) for row in rows]
    except subprocess.CalledProcessError:
        out = _nvidia_smi("--query-gpu=index,uuid,name", "--format=csv,noheader")
        rows = [[c.strip() for c in line.split(",", 2)] for line in out.splitlines() if line.strip()]
        return [(row[0], row[1], row[2], None, None) for row in rows]
