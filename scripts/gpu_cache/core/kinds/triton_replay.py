"""What the records say for the Triton replay (issue 26): the kernels the startup hook described
(``triton.kernels``) and the autotune choices it kept (``triton.autotuned``), each read as
untrusted data, field by field. Read by the Triton kind's warm step and the replay workload
(:mod:`gpu_cache.workloads.triton_replay`), both in the jobs' own software.
"""

from __future__ import annotations

import json
from typing import Any

from gpu_cache.core.hook_records import part

KIND = "triton"  # the section of a record the hook describes Triton's kernels in

#: At most this many kernel descriptions are taken from a records folder (issue 26).
MAX_KERNELS = 5000


def kernels(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Triton kernels the records describe (the hook's ``triton.kernels``), each once (the
    latest description of it: records of several Triton versions describe one kernel alike but
    for their key), in the order first recorded, at most :data:`MAX_KERNELS`. A description of
    the wrong shape is passed over; what its values mean is checked where it is compiled again."""
    out: dict[str, dict[str, Any]] = {}
    for record in sorted(found, key=lambda r: r["time"]):
        section = part(record, KIND) or {}
        items = section.get("kernels")
        for item in items if isinstance(items, list) else ():
            if _is_kernel(item):
                # one too deep for json.dumps is kept as it is: the replay skips it with a line
                same = json.dumps({k: v for k, v in item.items() if k not in ("key", "triton", "version")},
                                  sort_keys=True) if _shallow(item) else f"deep {len(out)}"
                if same in out or len(out) < MAX_KERNELS:
                    out[same] = item
    return list(out.values())


#: A description nested deeper than this is none the hook wrote (and would overflow the stack
#: of whoever walks it: ``json.dumps`` here, the replay's decoder).
MAX_DEPTH = 40


def _shallow(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` (from JSON) nests at most ``limit`` deep; never recursive."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            if depth >= limit:
                return False
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return True


def _is_kernel(item: Any) -> bool:
    shapes = {"module": str, "qualname": str, "signature": dict, "constants": list, "attrs": list,
              "options": dict, "target": dict}
    return (isinstance(item, dict) and all(isinstance(item.get(k), t) for k, t in shapes.items())
            and all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], list)
                    for p in item["constants"] + item["attrs"]))


def autotuned(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The autotune choices the records keep (the hook's ``triton.autotuned``), each once, in
    the order first recorded, at most :data:`MAX_KERNELS`; one of the wrong shape is passed over
    (what its values mean is checked where the replay writes it)."""
    out: dict[str, dict[str, Any]] = {}
    for record in sorted(found, key=lambda r: r["time"]):
        items = (part(record, KIND) or {}).get("autotuned")
        for item in items if isinstance(items, list) else ():
            if _is_choice(item) and len(out) < MAX_KERNELS:
                out.setdefault(json.dumps(item, sort_keys=True), item)
    return list(out.values())


def _is_choice(item: Any) -> bool:
    shapes = {"module": str, "qualname": str, "triton": str, "cache_key": str, "target": dict,
              "key_text": str, "configs_timings": list, "chosen": int}
    return (isinstance(item, dict) and _shallow(item)
            and all(isinstance(item.get(k), t) for k, t in shapes.items())
            and "key" in item and all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], dict)
                                      for p in item["configs_timings"]))
