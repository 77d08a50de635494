"""Preflight checks: can each cache folder be used, what is it on, and what will the jobs see."""

from __future__ import annotations

import os
import stat
from importlib import metadata
from typing import Any

from gpu_cache import device, env
from gpu_cache.fs import check_folder
from gpu_cache.settings import KINDS, Settings
from gpu_cache.units import format_size

#: Packages whose versions are part of cache keys or decide whether a cache works.
KEY_PACKAGES = ("jax", "jaxlib", "triton", "torch", "zstandard", "filelock")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def preflight(settings: Settings) -> dict[str, Any]:
    """Check every cache kind's folder (creating it) and collect what decides cache keys.

    ``ok`` is False when a kind cannot use its folder; ``warnings`` are worth reading but
    do not stop caching.
    """
    report: dict[str, Any] = {"cache_root": str(settings.cache_root) if settings.cache_root else None,
                              "kinds": {}, "warnings": [], "ok": True}
    if settings.cache_root is None:
        report["warnings"].append("caching is turned off (cache root 'none')")
    else:
        for kind in KINDS:
            check = check_folder(settings.cache_root / kind)
            report["kinds"][kind] = check.as_dict()
            if check.problem:
                report["ok"] = False
            elif check.mode and stat.S_IMODE(os.stat(check.path).st_mode) & stat.S_IWOTH:
                report["warnings"].append(
                    f"{kind}: {check.path} is world-writable; whoever can write a cache can run "
                    "code in every job that reads it (chmod o-w)")
            if check.network and kind == "jax" and settings.xla_caches != "none":
                report["warnings"].append(
                    f"jax: {check.path} is on {check.fs_type}; set xla_caches: none (XLA's "
                    "autotune cache fails atomic renames on network filesystems)")
    exports = env.resolve(settings)
    report["exports"] = exports.as_dict()
    report["warnings"] += exports.messages()
    report["device"] = device.detect().as_dict()
    report["versions"] = {name: _version(name) for name in KEY_PACKAGES}
    report["key_environment"] = {name: os.environ.get(name) for name in
                                 ("XLA_FLAGS", "JAX_ENABLE_X64", "CUDA_VISIBLE_DEVICES",
                                  "TRITON_DEFAULT_FP_FUSION", "TRITON_DISABLE_LINE_INFO")}
    return report


def render(report: dict[str, Any]) -> str:
    """The human-readable form of :func:`preflight`."""
    lines = [f"cache root: {report['cache_root'] or 'none (caching off)'}"]
    for kind, check in report["kinds"].items():
        free = format_size(check["free_bytes"]) if check["free_bytes"] is not None else "?"
        state = "ok" if check["problem"] is None else f"PROBLEM: {check['problem']}"
        lines.append(f"{kind:>9}: {state} ({check['fs_type']}, {free} free, {check['mode']}) {check['path']}")
    dev = report["device"]
    lines.append(f"   device: {dev['name']} x{dev['count']} (gpu_type {dev['gpu_type']})")
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items() if v)
    lines.append(f" versions: {versions}")
    lines += [f"  warning: {w}" for w in report["warnings"]]
    lines.append("result: " + ("ok" if report["ok"] else "some caches cannot be used (jobs still run)"))
    return "\n".join(lines) + "\n"
