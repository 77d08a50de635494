"""Which device a job sees: the GPU model (as a gpu_type name) and how many are visible."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass

_VENDOR_WORDS = {"nvidia", "tesla", "geforce", "quadro"}


@dataclass(frozen=True)
class Device:
    """``name`` as the driver reports it (``NVIDIA H200``), ``gpu_type`` (``h200``), ``count`` visible."""

    name: str
    gpu_type: str
    count: int
    visible_devices: str | None = None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def gpu_type_of(product_name: str) -> str:
    """A short, wildcard-safe type name for a GPU product name.

    ``NVIDIA H200`` -> ``h200``, ``NVIDIA A100-SXM4-80GB`` -> ``a100``,
    ``NVIDIA GeForce RTX 4090`` -> ``rtx4090``, ``NVIDIA L40S`` -> ``l40s``.
    """
    words = [w for w in re.split(r"[\s_]+", product_name.lower()) if w and w not in _VENDOR_WORDS]
    if not words:
        return "gpu"
    first = words[0].split("-")[0]
    if first in {"rtx", "gtx", "titan"} and len(words) > 1:
        first += words[1].split("-")[0]
    return re.sub(r"[^a-z0-9_.]", "", first) or "gpu"


def _visible_indices(environ: Mapping[str, str]) -> list[str] | None:
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return [part for part in value.split(",") if part.strip() and part.strip() != "-1"]


def detect(environ: Mapping[str, str] | None = None) -> Device:
    """The device this process would compute on: its first visible NVIDIA GPU, else the CPU.

    Asks ``nvidia-smi`` (which ignores CUDA_VISIBLE_DEVICES, so the visible set is applied
    here). Never raises: without a working ``nvidia-smi`` the device is ``cpu``.
    """
    environ = os.environ if environ is None else environ
    visible = _visible_indices(environ)
    names: list[str] = []
    if shutil.which("nvidia-smi") and visible != []:
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=index,uuid,name", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=30, check=True,
            ).stdout
            rows = [[c.strip() for c in line.split(",", 2)] for line in out.splitlines() if line.strip()]
            if visible is None:
                names = [row[2] for row in rows]
            else:
                by_id = {row[0]: row[2] for row in rows} | {row[1]: row[2] for row in rows}
                names = [by_id[v.strip()] for v in visible if v.strip() in by_id]
        except (OSError, subprocess.SubprocessError, IndexError):
            names = []
    visible_text = environ.get("CUDA_VISIBLE_DEVICES")
    if not names:
        return Device(name="cpu", gpu_type="cpu", count=0, visible_devices=visible_text)
    return Device(name=names[0], gpu_type=gpu_type_of(names[0]), count=len(names),
                  visible_devices=visible_text)
