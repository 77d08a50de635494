"""Single-flight for Inductor's caches (issue 31), in real torch.compile processes on the CPU
(Inductor's C++ backend): processes that start together on an empty root compile each graph
about once, a leader whose compile raises frees the others at once, and a torch whose
functions the hook does not know is left untouched."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import types
from collections import Counter
from pathlib import Path

import pytest

from helpers import HOOK, records
from inductor_jobs import WORKLOAD, job_env

pytest.importorskip("torch")


#: One job: imports torch, says it is ready, waits for the go file, then runs the workload.
#: With ``fail``, its graph compile sleeps a second and raises (user code failing inside the
#: compile: the cache keys stay the same as the others').
DRIVER = r'''
import json, os, sys, time
ready, go, fail = sys.argv[1:4]
import torch
if fail == "fail":
    import torch._inductor.compile_fx as compile_fx
    def broken(*args, **kwargs):
        time.sleep(1.0)
        raise RuntimeError("this compile fails on purpose")
    compile_fx.fx_codegen_and_compile = broken
from gpu_cache.workloads import torch_compile
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.002)
if fail == "forward-only":  # compiles the training graph's forward, never runs its backward
    torch.manual_seed(0)
    model = torch.compile(torch_compile._model(torch, 1, 32, 2), dynamic=False)
    model(torch.randn(2, 16, 32))
    time.sleep(float(os.environ.get("HOLD_SECONDS", "0")))
    sys.exit(0)
sys.exit(torch_compile.main(json.loads(sys.argv[4])))
'''


def start(tmp_path: Path, root: Path, fail: tuple[bool | str, ...], lead_first: bool = False,
          **extra: str) -> list:
    """One job per entry of ``fail``, started at one instant; with ``lead_first``, the others
    once the first holds a key's lock (a fixed head start was not enough on CI's two loaded
    cores: the second job took the key and the first never led). Their completed processes."""
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    sync = tmp_path / f"sync-{time.monotonic_ns()}"
    sync.mkdir()
    environ = dict(job_env(root), **extra)

    def spawn(i: int, failing: bool | str) -> subprocess.Popen:
        mode = failing if isinstance(failing, str) else "fail" if failing else "-"
        return subprocess.Popen([sys.executable, str(driver), str(sync / f"ready{i}"), str(sync / f"go{i}"),
                                 mode, json.dumps(WORKLOAD)], env=environ,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    procs = [spawn(i, failing) for i, failing in enumerate(fail)]
    deadline = time.monotonic() + 180
    while len(list(sync.glob("ready*"))) < len(procs) and time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.01)
    (sync / "go0").touch()
    locks = root / "locks" / "inductor"
    while lead_first and procs[0].poll() is None and time.monotonic() < deadline:
        if locks.is_dir() and any(locks.iterdir()):
            break
        time.sleep(0.01)
    for i in range(1, len(procs)):
        (sync / f"go{i}").touch()
    done = []
    for p in procs:
        completed = subprocess.CompletedProcess(p.args, p.wait(timeout=600), *p.communicate())
        completed.pid = p.pid  # type: ignore[attr-defined]
        done.append(completed)
    return done


def fx_misses(sections: list[dict]) -> int:
    return sum(s["fxgraph"]["misses"] for s in sections)


@pytest.mark.slow
def test_three_processes_miss_the_fx_graph_cache_at_most_once_more_than_one_alone(tmp_path):
    """The lead's check: K misses for one process alone, at most K + 1 for three together."""
    alone = start(tmp_path, tmp_path / "alone", (False,))
    assert alone[0].returncode == 0, alone[0].stderr[-3000:]
    k = fx_misses(records(tmp_path / "alone", "inductor"))
    assert k == 2  # one block's forward and backward graph

    root = tmp_path / "together"
    runs = start(tmp_path, root, (False, False, False))
    assert all(r.returncode == 0 for r in runs), [r.stderr[-3000:] for r in runs]
    losses = {json.dumps(json.loads(r.stdout.strip().splitlines()[-1])["loss"]) for r in runs}
    assert len(losses) == 1  # the same results in every process
    sections = records(root, "inductor")
    assert len(sections) == 3 and {s["state"] for s in sections} == {"on"}
    assert fx_misses(sections) <= k + 1, [s["missed"] for s in sections]
    assert Counter(m["key"] for s in sections for m in s["missed"]).most_common(1)[0][1] == 1
    assert sum(s["fxgraph"]["hits"] for s in sections) >= 3 * k - (k + 1)  # the others loaded them
    flights = [s["single_flight"] for s in sections]
    assert sum(f["waited"] for f in flights) >= 1 and sum(f["gave_up"] for f in flights) == 0
    assert list((root / "locks" / "inductor").iterdir()) == []  # the leaders removed their locks


@pytest.mark.slow
def test_a_leader_whose_compile_raises_frees_the_processes_waiting_for_it(tmp_path):
    root = tmp_path / "root"
    runs = start(tmp_path, root, (True, False, False), lead_first=True)
    assert runs[0].returncode != 0 and "this compile fails on purpose" in runs[0].stderr
    assert all(r.returncode == 0 for r in runs[1:]), [r.stderr[-3000:] for r in runs[1:]]
    by_pid = {r["pid"]: r for r in (json.loads(p.read_text()) for p in (root / "records").glob("*.json"))}
    leader = by_pid[runs[0].pid]
    assert leader["inductor"]["single_flight"]["abandoned"] >= 1  # it told its waiters
    followers = [r["inductor"] for pid, r in by_pid.items() if r is not leader]
    assert len(followers) == 2
    # They waited for the failed leader, not for the 3-minute timeout.
    assert all(f["single_flight"]["gave_up"] == 0 for f in followers)
    assert all(f["single_flight"]["wait_seconds"] < 60 for f in followers)
    assert fx_misses(followers) >= 2  # the graphs were compiled after all


@pytest.mark.slow
def test_a_leader_that_never_runs_its_backward_frees_its_waiters_after_the_bound(tmp_path):
    """A training graph's AOTAutograd entry is saved only with the lazy backward: a leader
    that compiled the forward and then idles (here 70 s) holds its key for AWAIT_BACKWARD
    (30 s) after its last compile, not for the 3-minute timeout."""
    root = tmp_path / "root"
    started = time.monotonic()
    runs = start(tmp_path, root, ("forward-only", False), lead_first=True, HOLD_SECONDS="70")
    assert all(r.returncode == 0 for r in runs), [r.stderr[-3000:] for r in runs]
    found = [json.loads(p.read_text()) for p in (root / "records").glob("*.json")]
    by_pid = {r["pid"]: r["inductor"] for r in found}
    leader, follower = by_pid[runs[0].pid], by_pid[runs[1].pid]
    assert leader["single_flight"]["awaited_backward"] == 1
    assert leader["single_flight"]["backward_bound_expired"] == 1
    assert follower["single_flight"]["gave_up"] == 0
    assert 20 < follower["single_flight"]["wait_seconds"] < 90, follower["single_flight"]
    assert time.monotonic() - started < 170  # the follower did not wait for the timeout


def test_a_torch_whose_functions_differ_is_left_untouched():
    """The checked signatures: a function missing, or with other leading parameters, is named."""
    sys.path.insert(0, str(HOOK))
    try:
        from gpu_cache_hook.kinds import inductor as piece
    finally:
        sys.path.remove(str(HOOK))

    def prepare_key(gm, example_inputs, fx_kwargs, inputs_to_check, remote):
        return None

    module = types.ModuleType(piece.COMPILE_FX)
    module._compile_fx_inner = lambda gm, example_inputs, **kwargs: None
    module.compile_fx = lambda model_, example_inputs_, inner_compile=None: None
    assert piece.mismatch(module, []) is None
    module.compile_fx = lambda model, example_inputs: None
    assert "compile_fx('model', 'example_inputs') is not compile_fx('model_', 'example_inputs_')" in \
        piece.mismatch(module, [])
    del module.compile_fx
    assert piece.mismatch(module, []).endswith("compile_fx is missing")


#: A job whose torch has a function of another shape than the hook knows: after Inductor's code
#: cache is imported (and before the hook sees it: a finder ahead of Python's own) its
#: ``FxGraphCache.prepare_key`` takes ``(*args, **kwargs)``, as another release's might. It
#: compiles a function, then says which of torch's functions are still the ones it had.
OTHER_TORCH = r'''
import importlib.machinery, json, sys
CODECACHE, COMPILE_FX = "torch._inductor.codecache", "torch._inductor.compile_fx"
seen = {}

class OtherTorch:
    def find_spec(self, name, path=None, target=None):
        if name not in (CODECACHE, COMPILE_FX):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            if name == CODECACHE:
                cache = module.FxGraphCache
                prepare = cache.prepare_key
                cache.prepare_key = staticmethod(lambda *args, **kwargs: prepare(*args, **kwargs))
                seen.update({n: (cache, getattr(cache, n)) for n in
                             ("prepare_key", "load_with_key", "_lookup_graph", "_save_graph")})
            else:
                seen.update({n: (module, getattr(module, n)) for n in ("compile_fx", "_compile_fx_inner")})

        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(sys.meta_path.index(importlib.machinery.PathFinder), OtherTorch())
import torch
print(json.dumps(torch.compile(lambda x: (x * 2.0).sin())(torch.zeros(3)).tolist()))
print(json.dumps({name: getattr(owner, name) is func for name, (owner, func) in seen.items()}))
'''


@pytest.mark.slow
def test_a_torch_whose_compile_functions_differ_runs_untouched_and_the_record_says_why(tmp_path):
    root = tmp_path / "root"
    program = tmp_path / "other_torch.py"
    program.write_text(OTHER_TORCH)
    done = subprocess.run([sys.executable, str(program)], env=job_env(root), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result, untouched = (json.loads(line) for line in done.stdout.strip().splitlines()[-2:])
    assert result == [0.0, 0.0, 0.0] and untouched == dict.fromkeys(untouched, True) and len(untouched) == 6
    (section,) = records(root, "inductor")
    assert section["state"].startswith("off: torch ") and \
        "FxGraphCache.prepare_key('args', 'kwargs') is not prepare_key('gm'" in section["state"]
    assert section["single_flight"]["state"] == section["state"]
    assert section["fxgraph"]["misses"] == 1  # torch's own counters still count
    assert not (root / "locks" / "inductor").exists() or list((root / "locks" / "inductor").iterdir()) == []


#: A process that starts Inductor's compile workers as torch.compile does on a GPU (a sidecar
#: process that imports triton, and its pool), waits until they are ready, and exits.
WORKER_POOL = r'''
from torch._inductor.async_compile import AsyncCompile
AsyncCompile.warm_pool()
AsyncCompile.wakeup()
AsyncCompile.wait_pool_ready()
'''


@pytest.mark.slow
def test_inductors_compile_workers_leave_the_record_to_the_process_that_started_them(tmp_path):
    root = tmp_path / "root"
    environ = dict(job_env(root), TORCHINDUCTOR_COMPILE_THREADS="2")
    done = subprocess.run([sys.executable, "-c", WORKER_POOL], env=environ, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = [json.loads(p.read_text()) for p in (root / "records").glob("*.json")]
    assert [r["argv"][0] for r in found] == ["-c"], [r["argv"] for r in found]  # not the workers'


@pytest.mark.slow
def test_through_the_node_local_tier_a_second_node_waits_and_loads_the_first_nodes_graphs(tmp_path):
    """Two nodes (mount namespaces, each with its own folder at the local tier's path) on one
    shared root, cluster mode (leases): the graphs are compiled once, and the other node's
    process copies them from the shared tier after its wait."""
    from tier_local import node_env, on_node

    root, local = tmp_path / "shared root", tmp_path / "local"  # no space where Inductor builds
    for kind in ("inductor", "triton", "jax"):
        (root / kind).mkdir(parents=True)
    local.mkdir()
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    sync = tmp_path / "sync"
    sync.mkdir()
    procs = []
    for node in ("node-a", "node-b"):
        environ = node_env(root, local, tmp_path / "records", GPU_CACHE_LOCKS=str(root / "locks"),
                           GPU_CACHE_LOCK_MODE="cluster", GPU_CACHE_LOCK_TIMEOUT="180",
                           TORCHINDUCTOR_CACHE_DIR=str(local / "inductor"))
        command = [sys.executable, str(driver), str(sync / f"ready-{node}"), str(sync / "go"), "-",
                   json.dumps(WORKLOAD)]
        procs.append(on_node(tmp_path / node, local, command, environ))
    deadline = time.monotonic() + 180
    while len(list(sync.glob("ready-*"))) < 2 and time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.01)
    (sync / "go").touch()
    for proc in procs:
        _out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
    sections = [json.loads(p.read_text())["inductor"] for p in (tmp_path / "records").glob("*.json")]
    assert len(sections) == 2
    assert fx_misses(sections) <= 2 + 1, [s["missed"] for s in sections]
    waited = [s for s in sections if s["single_flight"]["hits_after_wait"]]
    assert len(waited) == 1 and waited[0]["single_flight"]["mode"] == "cluster"
    assert waited[0]["tier"]["fetched"] > 0  # the leader's entries, from the shared tier
    leader = next(s for s in sections if s is not waited[0])
    assert leader["tier"]["promoted"] > 0
    assert any((root / "inductor" / "fxgraph").rglob("*"))
    assert any((root / "inductor" / "aotautograd").iterdir())
