"""What single-flight saved and cost, as `gpu-cache stats` shows it per rule (issue 50 item 3):
a real Snakemake run, under the shipped gpu-cache profile, of two jobs of one rule that start
compiling one JAX program at once on an empty root."""

from __future__ import annotations

import json
import sys

import pytest

from helpers import REPO, clean_environ, run_cli, run_snakemake

#: One job: imports jax, waits for the other job (files in ``sync/``), then compiles a program
#: of some 40 fused steps (about a second on the CPU) and prints its result.
JOB = r'''
import os, sys, time
import jax, jax.numpy as jnp, numpy as np
sample, sync = sys.argv[1], sys.argv[2]
open(os.path.join(sync, "ready-" + sample), "w").close()
deadline = time.monotonic() + 120
while len(os.listdir(sync)) < 2 and time.monotonic() < deadline:
    time.sleep(0.002)
def fold(x):
    for i in range(40):
        x = jnp.tanh(x @ x.T * 0.01 + i) if i % 2 else jnp.sin(x * (i + 1)).cumsum(0)
    return x.sum()
print(float(jax.jit(fold)(np.ones((16, 16), np.float32))))
'''

#: ``run:`` jobs: Snakemake runs each in a process of its own (``snakemake --target-jobs
#: fold:sample=a``), from which the startup hook learns the job's rule.
SNAKEFILE = f'''
rule all:
    input: expand("out/{{sample}}.txt", sample=["a", "b"])

rule fold:
    output: "out/{{sample}}.txt"
    run:
        shell("{sys.executable} job.py {{wildcards.sample}} sync > {{output}}")
'''


@pytest.mark.slow
def test_stats_shows_per_rule_the_seconds_waited_against_the_seconds_compiled(tmp_path):
    work, root = tmp_path / "wf", tmp_path / "cache"
    (work / "sync").mkdir(parents=True)
    (work / "job.py").write_text(JOB)
    (work / "Snakefile").write_text(SNAKEFILE)
    done = run_snakemake(work, "--profile", str(REPO / "profiles" / "gpu-cache"), "--cores", "2",
                         env=clean_environ(GPU_CACHE_ROOT=str(root), JAX_PLATFORMS="cpu"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert (work / "out" / "a.txt").read_text() == (work / "out" / "b.txt").read_text()

    stats = json.loads(run_cli("stats", "--json", "--cache-root", str(root)).stdout)
    fold = stats["usage"]["by_rule"]["fold"]  # the rule, learnt from Snakemake's own processes
    assert fold["processes"] == 2 and fold["jax_misses"] == fold["jax_hits"] >= 1  # compiled once
    records = [json.loads(p.read_text()) for p in (root / "records").glob("*.json")]
    waiter = next(r["jax"] for r in records if r["jax"]["single_flight"]["waited"])
    leader = next(r["jax"] for r in records if r["jax"]["single_flight"]["led"])
    (wait,) = waiter["single_flight"]["waits"]  # the one key it waited for, named
    assert wait["outcome"] == "hit" and wait["key"] in {m["key"] for m in leader["missed"]}
    assert fold["waited_seconds"] == pytest.approx(waiter["single_flight"]["wait_seconds"], abs=0.002)
    assert fold["compiled_seconds"] == pytest.approx(leader["own_compile_seconds"], abs=0.002)
    # The waiter waited for a compile it would have done: not longer than the leader took on it.
    compiled = next(m["seconds"] for m in leader["missed"] if m["key"] == wait["key"])
    assert 0 < wait["seconds"] <= compiled + 0.5, (wait, compiled)
    # JAX's compile step of each process, split: its own compiles, loading and waiting.
    for jax in (waiter, leader):
        parts = jax["own_compile_seconds"] + jax["load_seconds"] + jax["single_flight"]["wait_seconds"]
        assert parts == pytest.approx(jax["compile_seconds"], abs=0.01)
    shown = run_cli("stats", "--cache-root", str(root)).stdout
    line = next(line for line in shown.splitlines() if line.startswith("  fold: "))
    print(line)
    assert (f"; {fold['waited_seconds']:.1f} s waiting on other jobs' compiles, "
            f"{fold['compiled_seconds']:.1f} s compiling their own") in line
