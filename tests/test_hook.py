"""The stats hook in real processes: records, no cost without jax/triton, the user's own
sitecustomize, never breaking a job, the rule of a Snakemake job, and last use for prune."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from helpers import clean_environ, jax_job_env, run_cli, run_snakemake

JAX_PROGRAM = "import jax, jax.numpy as jnp; print(jax.jit(lambda x: jnp.cos(x) * 3)(jnp.ones(3)))"


def hook_env(cache_root: Path, *more_path: str, **extra: str) -> dict[str, str]:
    return jax_job_env(cache_root / "jax", records=cache_root / "records", extra_path=more_path, **extra)


def python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)


def records_of(cache_root: Path) -> list[dict]:
    folder = cache_root / "records"
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.exists() else []


def test_a_jax_process_writes_one_record_with_hits_misses_and_key_parts(cache_root):
    env = hook_env(cache_root, GPU_CACHE_RULE="predict", GPU_CACHE_GPU_TYPE="cpu")
    assert python(JAX_PROGRAM, env).returncode == 0
    assert python(JAX_PROGRAM, env).returncode == 0
    cold, warm = records_of(cache_root)
    assert cold["rule"] == "predict" and cold["gpu_type"] == "cpu" and cold["host"]
    assert cold["device"] == {"platform": "cpu", "kinds": ["cpu"], "count": 1}
    assert cold["jax"]["misses"] >= 1 and cold["jax"]["hits"] == 0
    assert any(m["name"] == "jit__lambda" for m in cold["jax"]["missed"])
    assert warm["jax"]["misses"] == 0 and warm["jax"]["hits"] == cold["jax"]["misses"]
    assert isinstance(warm["jax"]["saved_seconds"], float)  # tiny programs: may be < 0
    parts = next(v for k, v in warm["jax"]["key_parts"].items() if k.startswith("jit__lambda-"))
    assert {"computation", "XLA flags", "compile_options", "accelerator_config", "compression"} <= set(parts)


def test_no_record_and_no_imports_in_a_process_without_jax_or_triton(cache_root):
    code = "import sys, json; print(json.dumps(sorted(sys.modules)))"
    plain = json.loads(python(code, clean_environ(PYTHONPATH="")).stdout)
    hooked = python(code, hook_env(cache_root))
    assert hooked.returncode == 0 and hooked.stderr == ""
    added = set(json.loads(hooked.stdout)) - set(plain) - {"json", "json.decoder", "json.scanner",
                                                            "json.encoder", "_json"}
    assert added <= {"sitecustomize", "importlib.machinery", "importlib.util"}, added
    assert not (cache_root / "records").exists()


def test_the_users_own_sitecustomize_still_runs(cache_root, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = 'yes'\n")
    env = hook_env(cache_root, str(mine))
    done = python("import os; " + JAX_PROGRAM + "; print(os.environ.get('USER_SITE_RAN'))", env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("yes")
    assert len(records_of(cache_root)) == 1  # and the hook still recorded


def test_a_broken_hook_never_breaks_the_job(cache_root, tmp_path):
    # The records folder is a file: writing the record fails; the job still succeeds.
    (cache_root).mkdir(parents=True)
    (cache_root / "records").write_text("not a folder")
    done = python(JAX_PROGRAM, hook_env(cache_root))
    assert done.returncode == 0
    warnings = [line for line in done.stderr.splitlines() if line.startswith("gpu-cache: warning")]
    assert len(warnings) == 1 and "writing the record" in warnings[0]


def test_a_snakemake_job_is_recorded_with_its_rule_and_wildcards(cache_root, tmp_path):
    # Snakemake exports no rule name to jobs; a job run in a process of its own (SLURM's job
    # script and srun step, any remote executor) is run by `snakemake --target-jobs R:W`.
    work = tmp_path / "wf"
    work.mkdir()
    (work / "Snakefile").write_text(
        "rule predict:\n"
        "    output: 'out/{sample}.txt'\n"
        f"    shell: '{sys.executable} -c \"{JAX_PROGRAM}\" > {{output}}'\n")
    env = hook_env(cache_root)
    done = run_snakemake(work, "--cores", "1", "--target-jobs", "predict:sample=a", env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    (record,) = records_of(cache_root)
    assert record["rule"] == "predict" and record["wildcards"] == "sample=a"


def test_a_hit_entry_survives_an_age_prune_and_a_never_hit_one_goes(cache_root):
    env = hook_env(cache_root)
    assert python(JAX_PROGRAM, env).returncode == 0
    entries = sorted((cache_root / "jax").glob("*-cache"))
    assert entries
    old = time.time() - 40 * 86400
    for entry in entries:
        os.utime(entry, (old, old))
    # A computation that is never used again, equally old.
    stale = cache_root / "jax" / f"jit_unused-{'0' * 64}-cache"
    stale.write_bytes(b"x" * 10)
    os.utime(stale, (old, old))
    assert python(JAX_PROGRAM, env).returncode == 0  # hits every entry: the hook bumps mtimes
    result = run_cli("prune", "--max-age", "30d", "--json", "--cache-root", str(cache_root),
                     env=clean_environ())
    assert result.returncode == 0, result.stderr
    assert not stale.exists()
    assert all(entry.exists() for entry in entries)
    assert json.loads(result.stdout)["jax"]["entries_removed"] == 1
