"""GPU types a pipeline targets, and the workloads each one warms."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpu_cache import device
from gpu_cache.errors import UsageError
from gpu_cache.settings import Settings
from gpu_cache.workload import Workload, resolve_workload


@dataclass(frozen=True)
class GpuType:
    """One target GPU type: its name (the gpu_type wildcard), workloads, GPUs per job, resources."""

    name: str
    workload_names: tuple[str, ...]
    gpus: int = 1
    resources: dict[str, Any] = field(default_factory=dict)
    device: str | None = None

    @property
    def expected_device(self) -> str:
        """The device type its jobs must see: ``device`` if configured, else the type's name."""
        return self.device or self.name


def gpu_types(settings: Settings) -> dict[str, GpuType]:
    """The configured GPU types; when none are, the one type of this machine (``cpu`` without a GPU)."""
    configured = settings.config.get("gpu_types") or {}
    defaults = tuple(settings.config.get("default_workloads") or ())
    if not configured:
        here = device.detect()
        return {here.gpu_type: GpuType(here.gpu_type, defaults, gpus=here.count)}
    return {
        name: GpuType(name, tuple(spec.get("workloads") or defaults), int(spec.get("gpus", 1)),
                      dict(spec.get("resources") or {}), spec.get("device"))
        for name, spec in configured.items()
    }


def device_problems(expected: GpuType, seen: device.Device) -> list[str]:
    """Why the device a job saw is not the one its GPU type promises (none when it is)."""
    if seen.gpu_type != expected.expected_device:
        return [f"device: expected a {expected.expected_device} for GPU type {expected.name}, "
                f"but the job saw {seen.name} (check the type's resources, or its device key)"]
    if seen.gpu_type != "cpu" and seen.count != expected.gpus:
        return [f"device: GPU type {expected.name} promises {expected.gpus} visible GPU(s) per job "
                f"but the job saw {seen.count}; JAX keys include the count, so the real jobs "
                "would miss"]
    return []


def workloads_of(settings: Settings, gpu_type: str) -> list[Workload]:
    """The resolved workloads of one GPU type.

    Raises:
        UsageError: the type is not configured, or names an unknown workload.
    """
    types = gpu_types(settings)
    if gpu_type not in types:
        raise UsageError(f"unknown GPU type {gpu_type!r}; configured types: {', '.join(types)}")
    return [resolve_workload(settings, name) for name in types[gpu_type].workload_names]
