"""Why did an Inductor graph miss? Diff the FX graph key parts of two processes (issue 31).

The startup hook records, per FX graph key a process computed, the parts Inductor hashes into
it (its own debug lines: the graph, each input's metadata, torch's version, the system (GPU,
CUDA, Triton), every Inductor config value, the compile options, ...), as a hash and, where
short, the value. A missed graph is compared with the closest earlier key of the graph of the
same name (``backward graph 0/1``: Dynamo's frame and compile number), and each changed part is
named with its values.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpu_cache.core.kinds.explaining import Explain, Seen

if TYPE_CHECKING:
    from gpu_cache.core.reports import Missed

#: What a changed part means, by the part's family (its name up to ``[``), as a hint.
FAMILY_HINTS = {
    "gm": "the graph itself changed: other model code, another Dynamo trace, or a value baked "
          "into the graph",
    "example_inputs": "an input of the graph changed (shape, dtype, strides, device or "
                      "requires_grad): other shapes need their own warm-up",
    "torch_version": "another torch version or build is installed",
    "system_info": "the system differs: another GPU model (Inductor keys on its name), CUDA or "
                   "Triton version",
    "inductor_config": "an Inductor config value differs (torch._inductor.config, "
                       "TORCHINDUCTOR_* variables, torch.compile(mode=..., options=...))",
    "inductor_config_comms": "an Inductor communication config value differs",
    "fx_kwargs": "Inductor's compile options differ (cudagraphs, cpp_wrapper, static inputs, ...)",
    "cpp_runtime_thread_count": "the number of CPU threads differs (OMP_NUM_THREADS, or a job "
                                "with another number of cores)",
    "deterministic_algorithms_settings": "torch.use_deterministic_algorithms differs",
    "cuda_matmul_settings": "torch.backends.cuda.matmul settings (TF32, reduced precision) differ",
    "default_dtype": "torch's default dtype differs",
}


def _section(record: dict[str, Any]) -> dict[str, Any]:
    part = record.get("inductor")
    return part if isinstance(part, dict) else {}


def _mapping(section: dict[str, Any], name: str) -> dict[str, Any]:
    found = section.get(name)
    return found if isinstance(found, dict) else {}


def parts_of(record: dict[str, Any], key: str) -> dict[str, list[Any]] | None:
    """The parts of ``key`` as the record keeps them (the context with the key's own parts
    over it, a part the key lacks left out), or None when it keeps none for the key."""
    section = _section(record)
    own = _mapping(section, "key_parts").get(key)
    if not isinstance(own, dict):
        return None
    parts = dict(_mapping(section, "key_context"))
    for name, value in own.items():
        if value is None:
            parts.pop(name, None)
        else:
            parts[name] = value
    return {name: value for name, value in parts.items() if isinstance(value, list) and value}


def _differ(parts: dict[str, list[Any]], theirs: dict[str, list[Any]]) -> list[str]:
    """The parts whose hash differs (a value's text may differ where its hash does not: a
    function's is its address)."""
    return sorted(p for p in set(parts) | set(theirs)
                  if (parts.get(p) or [None])[0] != (theirs.get(p) or [None])[0])


def name_of(record: dict[str, Any], key: str) -> str | None:
    found = _mapping(_section(record), "key_names").get(key)
    return found if isinstance(found, str) else None


def names(record: dict[str, Any]) -> list[str]:
    """The names of the graphs whose key parts the record keeps."""
    return [n for n in _mapping(_section(record), "key_names").values() if isinstance(n, str)]


def keys_named(record: dict[str, Any], name: str) -> list[str]:
    return [key for key, named in _mapping(_section(record), "key_names").items() if named == name]


def _family(part: str) -> str:
    return part.split("[", 1)[0]


def _value(parts: dict[str, list[Any]], part: str) -> str | None:
    found = parts.get(part)
    return found[1] if found and len(found) > 1 and isinstance(found[1], str) else None


def _specific(part: str, now: dict[str, Any], before: dict[str, Any], value_now: str | None,
              value_before: str | None) -> str | None:
    """A sentence naming the concrete difference behind one changed part, where the records
    show it."""
    family = _family(part)
    if family == "torch_version":
        versions = [(r.get("software") or {}).get("torch") for r in (before, now)]
        if versions[0] != versions[1]:
            return f"torch changed from {versions[0]} to {versions[1]}: warm in the jobs' own software"
    if family == "system_info":
        devices = [_section(r).get("device") for r in (before, now)]
        tritons = [(r.get("software") or {}).get("triton") for r in (before, now)]
        if devices[0] != devices[1]:
            return (f"the GPU changed from {devices[0]} to {devices[1]}: warm on the GPU type the "
                    "jobs run on")
        if tritons[0] != tritons[1]:
            return f"triton changed from {tritons[0]} to {tritons[1]}"
    if value_now is not None and value_before is not None and value_now != value_before:
        return f"{part} changed from {value_before} to {value_now}"
    return None


def explain_key(key: str, record: dict[str, Any], earlier: list[dict[str, Any]]) -> dict[str, Any]:
    """Explain why the FX graph ``key`` (computed by the process of ``record``) missed, against
    ``earlier`` records: the same shape as the JAX explanations, with ``kind`` ``inductor``."""
    name = name_of(record, key) or next(
        (m.get("name") for m in _section(record).get("missed") or []
         if isinstance(m, dict) and m.get("key") == key), None) or "graph"
    result: dict[str, Any] = {"kind": "inductor", "name": name, "key": key, "compared_with": None,
                              "changed": [], "causes": []}
    parts = parts_of(record, key)
    if parts is None:
        result["causes"] = ["the startup hook recorded no key parts for this graph (torch's "
                            "internals differ, or an older gpu-cache wrote the record)"]
        return result
    best: tuple[int, float, str, dict[str, Any], dict[str, list[Any]]] | None = None
    for other in earlier:
        if other is record:
            continue
        for other_key in keys_named(other, name):
            theirs = parts_of(other, other_key)
            if theirs is None:
                continue
            candidate = (len(_differ(parts, theirs)), -float(other.get("time") or 0.0), other_key,
                         other, theirs)
            if best is None or candidate[:2] < best[:2]:
                best = candidate
    if best is None:
        result["causes"] = [f"no earlier process compiled {name}: a first compile (was it part of "
                            "the warm-up workload, at the same shapes?)"]
        return result
    _count, _time, other_key, other, theirs = best
    result["compared_with"] = {"key": other_key, **{k: other.get(k) for k in
                                                    ("time", "host", "pid", "rule", "gpu_type", "run_id")}}
    if other_key == key:
        result["causes"] = ["the same graph was compiled before, but its entry was not in this "
                            "process's Inductor folder: it was pruned, not written (a failed "
                            "save), or the processes used different TORCHINDUCTOR_CACHE_DIR folders"]
        return result
    changed = _differ(parts, theirs)
    result["changed"] = changed
    causes = [_specific(p, record, other, _value(parts, p), _value(theirs, p)) for p in changed]
    families = sorted({_family(p) for p in changed})
    result["causes"] = [c for c in causes if c] + [
        f"{family}: {FAMILY_HINTS.get(family, 'this key part changed')}" for family in families]
    return result


class InductorExplain(Explain):
    """Each missed FX graph against the closest earlier key of the graph of its name."""

    missed_words = "graphs the process compiled (one by one below)"

    def record(self, record: dict[str, Any], earlier: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The FX graphs the process missed."""
        missed = _section(record).get("missed")
        keys = [m["key"] for m in missed if isinstance(m, dict) and isinstance(m.get("key"), str)
                and m["key"]] if isinstance(missed, list) else []
        return [explain_key(key, record, earlier) for key in keys]

    def missed(self, miss: Missed, record: dict[str, Any], seen: Seen) -> dict[str, Any]:
        earlier = seen.by_kind.get(self.kind.name, {}).get(miss.name, [])
        return explain_key(miss.key, record, earlier)

    def seen(self, record: dict[str, Any], seen: Seen) -> None:
        """The records by the names of the graphs they keep key parts of."""
        graphs = seen.by_kind.setdefault(self.kind.name, {})
        for graph in set(names(record)):
            graphs.setdefault(graph, []).append(record)
