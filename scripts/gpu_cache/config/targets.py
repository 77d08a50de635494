"""GPU types a pipeline targets, the workloads each one warms, and how they meet the
cluster's own names for its GPUs (its GRES types)."""

from __future__ import annotations

import re

from gpu_cache.config.settings import GpuType, Settings
from gpu_cache.core import device

#: What a GPU type's name may be: the schema's pattern for ``gpu_types`` keys (a test checks
#: they agree), matched whole (a name may not end in a newline).
GPU_TYPE_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def gpu_types(settings: Settings) -> dict[str, GpuType]:
    """The configured GPU types; when none are, the one type of this machine (``cpu`` without a GPU)."""
    if settings.gpu_types:
        return settings.gpu_types
    here = device.detect()
    return {here.gpu_type: GpuType(here.gpu_type, settings.default_workloads, gpus=here.count)}


def a_gpu(name: str) -> str:
    """``name`` after its article, as a sentence says it: a model's code (letters, then a digit)
    in capitals and spoken letter by letter (``an A100``, ``an H200``, ``an RTX4090``), a number
    as a number (``a 3090``, ``an 8000``), anything else as written (``an a100-mig1g.5gb``)."""
    if re.fullmatch(r"[a-z]{1,5}[0-9][a-z0-9]*", name):
        shown, vowel = name.upper(), name[0] in "aefhilmnorsx"  # the letters' names: "ay", "aitch"
    else:
        shown, vowel = name, name[:1].lower() in "aeiou8"
    return f"{'an' if vowel else 'a'} {shown}"


def device_matches(expected: GpuType, seen: device.Device) -> bool:
    """Whether ``seen`` is the device ``expected`` promises: its ``device`` (default: the
    type's name) is gpu-cache's name of it (``rtx3090``) or its exact product name
    (``NVIDIA A100-SXM4-80GB``, to tell memory variants of one model apart)."""
    return expected.expected_device in (seen.gpu_type, seen.name)


def device_problems(expected: GpuType, seen: device.Device) -> list[str]:
    """Why the device a job saw is not the one its GPU type promises (none when it is)."""
    if not device_matches(expected, seen):
        hint = "check the type's resources"
        if seen.gpu_type != "cpu" and expected.device is None:
            # A type named as the cluster names the GPU (gpu:3090) needs its device spelled out.
            hint += (f"; if this is the GPU the type means, add `device: {seen.gpu_type}` to "
                     f"gpu_types.{expected.name}")
        return [f"device: GPU type {expected.name} expects device {expected.expected_device}, "
                f"but the job saw {seen.name} (gpu-cache names it {seen.gpu_type}; {hint})"]
    if seen.gpu_type != "cpu" and seen.count != expected.gpus:
        return [f"device: GPU type {expected.name} promises {expected.gpus} visible GPU(s) per job "
                f"but the job saw {seen.count}; JAX keys include the count, so the real jobs "
                "would miss"]
    return []


def gres_names(spec: GpuType) -> set[str]:
    """The GRES type names (as the cluster names its GPUs) that a GPU type's resources ask
    for: ``gres: gpu:3090:1`` and ``gpu_model: 3090`` both name ``3090``."""
    found = set()
    gres = spec.resources.get("gres")
    for part in str(gres).split(",") if gres else ():
        fields = part.strip().split(":")
        if len(fields) >= 3 or (len(fields) == 2 and not fields[1].isdigit()):
            found.add(fields[1])
    if spec.resources.get("gpu_model"):
        found.add(str(spec.resources["gpu_model"]))
    return found


def yaml_text(name: str) -> str:
    """``name`` as YAML must spell it to read it back as that text: quoted where YAML would
    read a number, a truth value or null (``3090``, ``on``)."""
    import yaml

    try:
        plain = yaml.safe_load(name) == name
    except yaml.YAMLError:
        plain = False
    return name if plain else '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def gres_mapping(types: dict[str, GpuType], offered: dict[str, set[str]]) -> list[str]:
    """One line per GRES type name the cluster offers (``offered``: by partition, from
    :func:`gpu_cache.config.cluster.gres_by_partition`) saying which configured GPU types ask
    for it (or that none does), then one per configured type that asks for a name no partition
    offers."""
    asked = {name: gres_names(spec) for name, spec in types.items()}
    lines = []
    partitions: dict[str, list[str]] = {}
    for partition, names in sorted(offered.items()):
        for name in names:
            partitions.setdefault(name, []).append(partition)
    for name, where in sorted(partitions.items()):
        users = [t for t, names in asked.items() if name in names]
        quoted = yaml_text(name)
        what = (", ".join(f"GPU type {t} (device {types[t].expected_device})" for t in users)
                if users else
                f"no GPU type asks for it (to warm it: gpu_types: {{{quoted}: {{device: <the name "
                f"`gpu-cache doctor` prints on such a node>, resources: {{slurm_partition: "
                f"{yaml_text(where[0])}, gpu: 1, gpu_model: {quoted}}}}}}})")
        lines.append(f"gpu:{name} (partition {', '.join(where)}): {what}")
    every = {name for names in offered.values() for name in names}
    for gpu_type, names in sorted(asked.items()):
        for name in sorted(names - every):
            then = ("its jobs end unscheduled and hold nothing back" if types[gpu_type].is_optional
                    else "its warm job fails and no job that waits for its verdict runs")
            lines.append(f"GPU type {gpu_type} asks for gpu:{name}, which no partition offers: {then}")
    return lines
