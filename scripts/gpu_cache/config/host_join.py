"""What gpu-cache changes in a host pipeline when its module joins the host's rules (issue 49),
and what it says about an integration left half done.

- A host job that passes JAX a cache folder of its own (``--jax_compilation_cache_dir=DIR``:
  AlphaPulldownSnakemake's AlphaFold 3 batches of several folds, its own folder, never warmed) is
  pointed at gpu-cache's: the module rewrites that flag in the parameters of the host's rules it
  joins to ``"--jax_compilation_cache_dir=${JAX_COMPILATION_CACHE_DIR:-DIR}"``, which the job's
  shell expands (the host's DIR where the job has no cache, caching off). A job that passes no
  such flag gets none (an AlphaFold 2 backend refuses it): the flag comes from the module, never
  from a config file, so settings without the module change no job.
- Settings of an older README still in a host's own config file (``gpu_cache:`` pasted into its
  ``config.yaml``, or the flag as ``$JAX_COMPILATION_CACHE_DIR`` in one of its mappings, which
  replaced the host's own mapping there) are named in one line that says where they go now.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from gpu_cache.core import safe_io

#: The flag through which a host tells JAX (AlphaFold 3's run scripts) its cache folder.
JAX_FLAG = "--jax_compilation_cache_dir"
#: The variable gpu-cache exports for it (the folder the job's JAX uses: the root's or its tier).
JAX_VARIABLE = "JAX_COMPILATION_CACHE_DIR"
_FLAG = re.compile(rf"(?<![\w-]){re.escape(JAX_FLAG)}=(\S+)")
#: What a folder may hold to go inside the shell's double quotes as it is.
_PLAIN = re.compile(r"[^\"$`\\]+")


def pointed(value: str) -> str:
    """``value`` (a host rule's parameter, shell text) with each ``--jax_compilation_cache_dir=DIR``
    pointed at gpu-cache's folder, DIR kept as the fallback where the job has none. A DIR that
    is itself shell (``$VAR``, quotes) is left as the host wrote it."""

    def point(match: re.Match[str]) -> str:
        folder = match.group(1)
        if not _PLAIN.fullmatch(folder):
            return match.group(0)
        return f'"{JAX_FLAG}=${{{JAX_VARIABLE}:-{folder}}}"'

    return _FLAG.sub(point, value)


def pointed_param(value: Any) -> Any:
    """A rule's parameter (text, a list of texts, or a function of the job that makes one) with
    :func:`pointed` applied to what it gives."""
    if isinstance(value, str):
        return pointed(value)
    if isinstance(value, list):
        return [pointed_param(item) for item in value]
    if callable(value):
        return _pointing(value)
    return value


def _pointing(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` whose result is pointed; Snakemake sees its own signature (``__wrapped__``)
    and passes it what it asks for."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return pointed_param(function(*args, **kwargs))

    return wrapper


def point_rule_params(params: Any) -> None:
    """Point every parameter of a host rule in place: Snakemake's ``Params`` is a list whose
    named items are also its attributes (read from there when a job's parameters are made)."""
    for index, value in enumerate(params):
        params[index] = pointed_param(value)
    for name in list(params.keys()):
        value = getattr(params, name)
        if isinstance(value, list):  # a named range: its own list
            value[:] = pointed_param(list(value))
        else:
            setattr(params, name, pointed_param(value))


def _is_flag(value: Any) -> bool:
    """Whether a host's value is the older README's flag value, ``$JAX_COMPILATION_CACHE_DIR``."""
    return isinstance(value, str) and value.strip() in (f"${JAX_VARIABLE}", f"${{{JAX_VARIABLE}}}")


def pasted_settings(path: str, data: Mapping[str, Any] | None) -> str | None:
    """A line when the host's own config file ``path`` (its contents ``data``) holds settings that
    belong in gpu-cache's file now: its ``gpu_cache:`` block or ``gpu_cache_workflow``, or a value
    ``$JAX_COMPILATION_CACHE_DIR`` (the older README's flag). None: it holds none."""
    if not isinstance(data, Mapping):
        return None
    blocks = [key for key in ("gpu_cache", "gpu_cache_workflow") if key in data]
    flags = [f"{key}.{flag}" for key, value in data.items() if isinstance(value, Mapping)
             for flag, setting in value.items() if _is_flag(setting)]
    held = [f"gpu-cache's settings ({', '.join(map(str, blocks))}), as an older README had them: move "
            "them into a file of their own, passed with --configfile (config/gpu-cache.yaml, README)"] \
        if blocks else []
    held += [f"{', '.join(map(str, flags))}, which gpu-cache's module sets itself now: delete it (where it "
             "replaced the host's own mapping, put back its keys, such as --fold_backend)"] if flags else []
    return f"{path} holds " + "; and ".join(held) if held else None


def dropped_arguments(path: str) -> str | None:
    """A line when the host's own config file ``path`` gives a mapping twice, the second with the
    older README's flag (its block pasted at the end): YAML keeps the second, so every job of the
    host would lose the first's other keys (``--fold_backend``, which picks the structure's
    backend). None where it does not (or the file cannot be read: its reader says why)."""
    import yaml

    try:
        root = yaml.compose(safe_io.read_bounded(path, 1 << 20).decode("utf-8"), Loader=yaml.SafeLoader)
    except (OSError, ValueError, yaml.YAMLError, RecursionError):  # ValueError: not UTF-8
        return None
    given: dict[str, list[Any]] = {}
    for key, value in root.value if isinstance(root, yaml.MappingNode) else []:
        if isinstance(key, yaml.ScalarNode) and isinstance(value, yaml.MappingNode):
            given.setdefault(key.value, []).append(value)
    for name, mappings in given.items():
        last = {k.value: v for k, v in mappings[-1].value if isinstance(k, yaml.ScalarNode)}
        if not any(isinstance(v, yaml.ScalarNode) and _is_flag(v.value) for v in last.values()):
            continue
        lost = list(dict.fromkeys(k.value for m in mappings[:-1] for k, _ in m.value
                                  if isinstance(k, yaml.ScalarNode) and k.value not in last))
        if lost:
            return (f"{path} gives {name} twice, the second from an older README of gpu-cache, which "
                    f"replaces the first: every job would lose {', '.join(lost[:3])}"
                    f"{' and more' if len(lost) > 3 else ''}. Delete the pasted block; gpu-cache's settings "
                    "go in a file of their own, passed with --configfile (config/gpu-cache.yaml, README)")
    return None


#: Where a host pipeline keeps its Snakefile, from the folder of its config file (Snakemake's
#: standard layout: config/config.yaml beside workflow/Snakefile).
SNAKEFILES = ("../workflow/Snakefile", "Snakefile", "../Snakefile")


def unjoined(config_files: list[str], key: str = "gpu_cache") -> str | None:
    """A line when the host pipeline whose config files these are (gpu-cache's settings among
    them: a file with a ``key`` block) has a Snakefile that does not include gpu-cache's module:
    its settings alone change no job. None where it does, where no file is a host's, or where no
    Snakefile is found beside the files."""
    from gpu_cache.config.settings import read_config_file
    from gpu_cache.core.errors import UsageError

    try:
        if not any(key in (read_config_file(path) or {}) for path in config_files):
            return None
    except UsageError:
        return None
    for folder in dict.fromkeys(os.path.dirname(os.path.abspath(path)) for path in config_files):
        for name in SNAKEFILES:
            snakefile = os.path.normpath(os.path.join(folder, name))
            try:
                text = safe_io.read_bounded(snakefile, 4 << 20).decode("utf-8", "replace")
            except (OSError, ValueError):
                continue
            if re.search(r"^\s*module\s+gpu_cache\s*:", text, re.MULTILINE):
                return None
            return (f"{snakefile} does not include gpu-cache's module (the block at its end, README: "
                    "`module gpu_cache: snakefile: github(..., tag=...)`): with gpu-cache's "
                    "settings alone, the pipeline runs as before, uncached")
    return None
