"""The node-local tier's host side (issue 23): where this cache root's local tier is on a
node, and whether it may be read (``pack``, ``prune``, ``stats``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gpu_cache.config.settings import Settings


def trusted_local(settings: Settings, warn: Callable[..., None]) -> Path | None:
    """This node's local tier of the cache root when it exists and is trusted; one that is
    not is left out, with a warning through ``warn`` (its entries could be anyone's)."""
    from gpu_cache.jobenv import env, trust

    local = env.tier_folder(settings)
    if local is None or not local.is_dir():
        return None
    why = trust.distrust(local, settings.shared_group, env.tier_trusted_above(settings))
    if why:
        warn("local tier left out: %s", why)
        return None
    return local
