"""gpu-cache's config inside a host pipeline's: its block (``gpu_cache:``), whose values may
name the host's own keys instead of copying them (``container: {host: prediction_container}``),
in a file of its own that Snakemake merges into the host's (``--configfile``, mapping by
mapping), or that the CLI merges the same way (``--config`` given twice).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from typing import Any

from gpu_cache.config import expansion
from gpu_cache.config.settings import (
    DEFAULT_CONFIG,
    Settings,
    read_config_file,
    settings_from,
    validate_config,
)
from gpu_cache.core.errors import UsageError
from gpu_cache.core.shown import clipped

#: The key of a host pipeline's config that holds gpu-cache's.
HOST_KEY = "gpu_cache"
#: The one key of a value that names a key of the host's config: ``{host: KEY}``.
REFERENCE = "host"


def resolve(value: Any, host: Mapping[str, Any] | None, where: str) -> Any:
    """``value`` with each ``{host: KEY}`` in it replaced by the host config's value of KEY
    (taken as it is: the host's value, as the host's own rules read it). What is returned is
    a copy of all that ``value`` expands to (:func:`block` measures it first, ``expansion``);
    a host's value keeps its aliases shared (``deepcopy``), and is measured with the rest.

    Raises:
        UsageError: a reference without a host config, or to a key the host does not have.
    """
    if isinstance(value, dict) and set(value) == {REFERENCE} and isinstance(value[REFERENCE], str):
        key, named = value[REFERENCE], clipped(value[REFERENCE])
        if host is None:
            raise UsageError(f"config key {clipped(where, 200)}: {{host: {named}}} names a key of a host "
                             "pipeline's config, and there is none here (gpu-cache as a module gets it with "
                             "`config: config`; the CLI with --config naming the host's file)")
        if key not in host:
            import difflib

            near = difflib.get_close_matches(key, [str(k) for k in host], 1)
            hint = f"; did you mean {near[0]}?" if near else ""
            raise UsageError(f"config key {clipped(where, 200)}: {{host: {named}}}: the host's config "
                             f"has no key {named}{hint}")
        return copy.deepcopy(host[key])
    if isinstance(value, dict):
        return {k: resolve(v, host, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, host, f"{where}.{i}") for i, v in enumerate(value)]
    return value


def block(data: Mapping[str, Any] | None, key: str | None, source: str) -> tuple[Any, str]:
    """gpu-cache's config in ``data`` and the key that holds it (messages name a key by its whole
    path from there): the ``key`` block of a host's config (default :data:`HOST_KEY` where it has
    one), its references resolved against the host's keys; else all of ``data`` (gpu-cache's own
    config, where a reference is an error), and "".

    Raises:
        UsageError: ``key`` is given and ``data`` has no such block, or a reference is wrong.
    """
    wanted = key or HOST_KEY
    found = (data or {}).get(wanted)
    if key is None and not isinstance(found, dict):  # gpu-cache's own config
        # (keys that are not gpu-cache's: the schema check names the first, a clearer line)
        if not set(data or {}) <= set(DEFAULT_CONFIG):
            return data, ""
        expansion.measure(data, source)  # resolve copies what aliases repeat: measured first
        return resolve(data, None, ""), ""
    if not isinstance(found, dict):
        keys = ", ".join(sorted(map(str, data or {}))[:12]) or "none"
        raise UsageError(f"{source} has no {wanted}: block of gpu-cache's keys (its top-level "
                         f"keys: {keys}); --config-key names the key that holds it")
    expansion.measure(found, source, wanted)
    return resolve(found, data, wanted), wanted


def merged(base: Mapping[str, Any] | None, update: Mapping[str, Any] | None) -> dict[str, Any]:
    """``update`` merged into ``base`` mapping by mapping, as Snakemake merges --configfile
    files: a nested mapping gains keys; any other value is replaced."""
    out = dict(base or {})
    for key, value in (update or {}).items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) \
            else value
    return out


def workflow_config(config: Mapping[str, Any] | None) -> Any:
    """The config the workflow runs with, not yet validated (``settings_from`` does): its own,
    or, given a host's whole config (a module block with ``config: config``), the host's
    ``gpu_cache:`` block with its references resolved.

    Raises:
        UsageError: a reference is wrong.
    """
    return block(config, None, "the workflow's config")[0]


def workflow_settings(config: Mapping[str, Any] | None) -> Settings:
    """The settings of :func:`workflow_config`, a key named in a message by its whole path
    (``gpu_cache.host_rule``, where the config is a host's).

    Raises:
        UsageError: a reference is wrong, or the config does not match the schema.
    """
    found, where = block(config, None, "the workflow's config")
    return settings_from(found, where=where)


def load_config_files(paths: Sequence[str | os.PathLike[str]], key: str | None = None) -> dict[str, Any]:
    """Read YAML or JSON config files, merged in order (:func:`merged`), and validate
    gpu-cache's config in them: gpu-cache's own, or a host pipeline's (its config and the
    file of gpu-cache's settings for it) with gpu-cache's under ``key`` (:func:`block`).

    Raises:
        UsageError: a file cannot be read as a config (``settings.read_config_file``), has no
            ``key`` block, or the config does not match the schema.
    """
    data: dict[str, Any] | None = None
    for path in paths:
        data = merged(data, read_config_file(path))
    source = f"config file {paths[0]}" if len(paths) == 1 else \
        f"config files {', '.join(map(str, paths))}"
    found, where = block(data, key, source)
    try:
        return validate_config(found, where)
    except UsageError as exc:
        foreign = not where and not set(data or {}) <= set(DEFAULT_CONFIG)
        hint = ("; a host pipeline's config holds gpu-cache's under gpu_cache: (or the key "
                "--config-key names)") if foreign else ""
        raise UsageError(f"{source}: {exc}{hint}") from None
