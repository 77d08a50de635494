"""Collecting the outputs of one workload run for the outputs proof (issues 40 and 47,
docs/outputs.md): the environment the run gets (its wildcards, which its processes' records
keep, and for a built-in workload ``$GPU_CACHE_OUTPUTS``), its outputs file read once it has
ended, and a copy of it in the pass's scratch folder, which the pass compares or keeps once all
its runs have ended and their records are in (:mod:`gpu_cache.core.references`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpu_cache.core import names, safe_io
from gpu_cache.core.outputs import OutputsError, again_of, digest, load, nonfinite, number, spreads

#: The passes whose runs report outputs: the writer (warm), the reader (validate) and the
#: optional fresh compile (cold).
PHASES = ("warm", "validate", "cold")


def slug(workload: str, shape: Any) -> str:
    """The name of one run's outputs (a workload and shape are any text)."""
    return hashlib.sha256(f"{workload}\0{shape}".encode()).hexdigest()[:24]


def wildcards(workload: str, shape: Any) -> str:
    """What the records of one run name it by (``$GPU_CACHE_WILDCARDS``): its workload and shape."""
    return f"workload={workload},shape={shape}"


def _forget(path: str) -> None:
    """Remove a user's outputs file (and its second run's) before a run, so that a run that
    writes none is not credited with an earlier run's (a link is removed, not followed)."""
    for name in (path, again_of(path)):
        try:
            os.unlink(name)
        except OSError:
            pass  # none there, or not ours to remove: then it is read as it is


class Run:
    """One run's outputs: the environment it runs with, and its :meth:`report` once it has
    ended. ``scratch``: the pass's folder its outputs are copied to (as ``<name><suffix>``)."""

    def __init__(self, environ: dict[str, str], path: str | None, why_none: str | None,
                 scratch: Path | None, name: str) -> None:
        self.environ, self.path, self.why_none = environ, path, why_none
        self.scratch, self.name = scratch, name

    def report(self, ok: bool) -> dict[str, Any] | None:
        """What the run's outputs are (``digest``, ``bytes``, ``nonfinite``, ``spread``: the
        largest of its arrays' run-to-run noise, and ``kept``: the name of its copy in the
        scratch folder); None where outputs are not collected."""
        if self.path is None:
            return None if self.why_none is None else {"error": self.why_none}
        if not ok:
            return {"error": "the run failed"}
        try:
            data, first = load(self.path)
        except FileNotFoundError:
            return {"error": f"the run wrote no outputs ({self.path})"}
        except (OSError, OutputsError) as exc:
            return {"error": f"its outputs ({self.path}) cannot be read: {exc}"}
        try:
            again_data, again = load(again_of(self.path))
        except (OSError, OutputsError):
            again_data, again = None, None
        spread = spreads(first, again)
        largest = None if spread is None else number(max(spread.values(), default=0.0))
        out: dict[str, Any] = {"file": self.path, "digest": digest(first), "nonfinite": nonfinite(first),
                               "bytes": sum(len(a.data) for a in first.values()), "spread": largest}
        if self.scratch is not None:
            kept = self.name + os.path.splitext(self.path)[1]
            try:
                safe_io.replace_file(self.scratch / kept, data)
                if again_data is not None:
                    safe_io.replace_file(self.scratch / again_of(kept), again_data)
                out["kept"] = kept
            except OSError as exc:
                out["error"] = f"its outputs cannot be kept for the comparison: {exc.strerror or exc}"
        return out


@contextmanager
def collected(workload: str, shape: Any, builtin: bool, template: str | None, environ: Mapping[str, str],
              phase: str, scratch: Path | None, gpu_type: str) -> Iterator[Run]:
    """One run's outputs (see :class:`Run`), collected where ``scratch`` is given (a pass of
    :data:`PHASES` that compares or keeps outputs); a built-in workload writes them into a
    private temporary folder."""
    env = dict(environ, **{names.WILDCARDS_VAR: wildcards(workload, shape)})
    env.pop(names.OUTPUTS_VAR, None)
    name = slug(workload, shape)
    if scratch is None or phase not in PHASES:
        yield Run(env, None, None, None, name)
        return
    if not builtin:
        try:  # relative to the working folder; gpu-cache checked the template
            path = None if template is None else os.path.abspath(
                template.format_map({"shape": str(shape), "gpu_type": gpu_type}))
        except (KeyError, IndexError, ValueError):
            path = None
        why = None if path else "the workload names no usable outputs file (outputs: in its config)"
        if path:
            _forget(path)
        yield Run(env, path, why, scratch, name)
        return
    own = tempfile.mkdtemp(prefix="gpu-cache-outputs-")
    try:
        env[names.OUTPUTS_VAR] = os.path.join(own, "outputs.npz")
        yield Run(env, env[names.OUTPUTS_VAR], None, scratch, name)
    finally:
        shutil.rmtree(own, ignore_errors=True)


def used(records: Iterable[Mapping[str, Any]], workload: str, shape: Any, observed: Iterable[str]
         ) -> tuple[dict[str, list[str]], dict[str, list[str]]] | None:
    """The entries each kind served the processes of one run (their records' ``hit_keys``),
    and those they compiled themselves (``missed``); None where no process of the run left a
    record (no startup hook in it), or where a record dropped keys it could not keep."""
    named = wildcards(workload, shape)
    hits: dict[str, set[str]] = {}
    misses: dict[str, set[str]] = {}
    recorded = False
    for record in records:
        if record.get("wildcards") != named:
            continue
        recorded = True
        for kind in observed:
            section = record.get(kind)
            if not isinstance(section, dict):
                continue
            dropped = section.get("dropped")
            if isinstance(dropped, dict) and any(dropped.get(f) for f in ("hit_keys", "missed")):
                return None  # (over the hook's bound: the record cannot name them all)
            hits.setdefault(kind, set()).update(_texts(section.get("hit_keys")))
            missed = section.get("missed") if isinstance(section.get("missed"), list) else []
            misses.setdefault(kind, set()).update(
                m["key"] for m in missed if isinstance(m, dict) and isinstance(m.get("key"), str))
    if not recorded:
        return None
    return ({kind: sorted(keys) for kind, keys in hits.items() if keys},
            {kind: sorted(keys) for kind, keys in misses.items() if keys})


def _texts(value: Any) -> list[str]:
    return [item for item in value if isinstance(item, str)] if isinstance(value, list) else []

