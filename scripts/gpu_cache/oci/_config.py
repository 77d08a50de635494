"""The workflow's ``registry`` keys: which pack a GPU type fetches and where it publishes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def references(config: Mapping[str, Any], gpu_type: str) -> tuple[str | None, str | None]:
    """(fetch, publish) of ``gpu_type`` in a validated config: the type's own ``registry`` keys,
    each left out taken from the top-level ``registry``."""
    top = config.get("registry") or {}
    spec = (config.get("gpu_types") or {}).get(gpu_type) or {}
    own = spec.get("registry") or {}
    return own.get("fetch", top.get("fetch")), own.get("publish", top.get("publish"))
