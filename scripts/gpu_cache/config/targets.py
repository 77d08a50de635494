"""GPU types a pipeline targets, and the workloads each one warms."""

from __future__ import annotations

from gpu_cache.config.settings import GpuType, Settings
from gpu_cache.core import device


def gpu_types(settings: Settings) -> dict[str, GpuType]:
    """The configured GPU types; when none are, the one type of this machine (``cpu`` without a GPU)."""
    if settings.gpu_types:
        return settings.gpu_types
    here = device.detect()
    return {here.gpu_type: GpuType(here.gpu_type, settings.default_workloads, gpus=here.count)}


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
