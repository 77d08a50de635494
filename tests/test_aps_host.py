"""gpu-cache as a module of an AlphaPulldownSnakemake-shaped host (tests/aps_host: HEAD's config
keys, spellings and defaults, its rules' shape), deployed as its users deploy it and as the
README's module section says: the folder `snakedeploy deploy-workflow` makes (the pipeline as a
module, its config/ copied), gpu-cache as a second module at the end of that folder's
workflow/Snakefile, and gpu-cache's settings in a file of their own (config/gpu-cache.yaml,
passed with --configfile) that names the host's values by {host: KEY}. The pipeline's own files
are not edited. The SLURM test serves both modules by tag from git repositories (gitfile(...),
the same mechanism as github(...)); the others name the two Snakefiles by path.
Structure inference runs in a `container:` rule (through tests/bin/apptainer, the stand-in over
bwrap: Python 3.9 and jax 0.4.30) on any GPU of its partition, binds are set at parse time, no
--buckets (the jobs pad to AlphaPulldown's own), batches pass their own
--jax_compilation_cache_dir, and the built-in alphafold3 warm workload finds run_alphafold.py
where AlphaPulldown's images keep it (a stand-in, bound there).

Real Snakemake runs, a few seconds each; the cache root lies outside the container's
default binds, so the jobs see it only because gpu-cache binds it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from aps_deploy import (
    FIXTURE,
    HOST_ONLY,
    README_MODULE,
    aps_copy,
    aps_environ,
    job_counts,
    planned_jobs,
    profile,
    readme_blocks,
    write_yaml,
)
from gpu_cache.config.memory import run_memory_mb
from helpers import REPO, run_cli, run_snakemake

#: The host's own jobs (rules), whose every value must stay as the host made it.
HOST_RULES = ("all", "structure_inference", "analyze_structure", "recursive_report")



def test_a_dry_run_and_lint_plan_the_hosts_target_and_create_no_cache_folder(container_root, tmp_path):
    work = aps_copy(tmp_path)
    root = tmp_path / "cache"
    env = aps_environ(container_root, GPU_CACHE_ROOT=str(root))
    dry = run_snakemake(work, *profile(work), "-n", env=env)
    assert dry.returncode == 0, dry.stderr[-3000:]
    # The host's own `rule all` is the default target (gpu-cache's `all` is not), with
    # gpu-cache's jobs in front of the inference and its prune and summary after the report.
    jobs = job_counts(dry)
    assert jobs.get("all") == "1" and "gpu_cache_all" not in jobs, dry.stdout
    assert jobs["structure_inference"] == "3" and jobs["gpu_cache_warm_cache"] == "2"
    assert jobs["recursive_report"] == "1" and jobs["gpu_cache_cache_report"] == "1"
    (prune,) = planned_jobs(dry.stdout)["gpu_cache_prune_cache"]
    assert str(work / "output" / "reports" / "all_interfaces.csv") in prune[0]
    lint = run_snakemake(work, *profile(work), "--lint", env=env)
    assert "Traceback" not in lint.stderr, lint.stderr[-3000:]
    assert not root.exists(), "a dry run or --lint created the cache root"
    # gpu-cache adds no lint to the host: none for its rules, none for the block the README has
    # the host write (the look-alike keeps the lints of its own shape, as AlphaPulldownSnakemake).
    found = lint.stdout + lint.stderr
    headers = re.findall(r"^Lints for (.*)$", found, re.MULTILINE)
    assert headers and not [h for h in headers if "gpu_cache_" in h or str(REPO / "workflow") in h], found


def test_gpu_cache_changes_no_host_value_and_takes_the_hosts_by_reference(container_root, tmp_path):
    """Every job of the host, planned with and without gpu-cache's settings file, is the same
    but for the validations it waits for (the file adds no flag: batches of one fold pass none).
    gpu-cache's jobs take the partition, image and weights from the host's keys: a value the
    host changes (here on the command line) is theirs too. Their memory is what one process of
    each bucket needs (gpu_cache.config.memory), sized to run them side by side where no node of
    the host's partition says less (this machine's cluster, if any, has no gpu-el8)."""
    work = aps_copy(tmp_path)
    env = aps_environ(container_root, GPU_CACHE_ROOT=str(tmp_path / "cache"))
    partition = ("--config", "slurm_partition=[gpu-training, gpu-el8]")
    alone = run_snakemake(work, *profile(work, *HOST_ONLY), *partition, "-n", env=env)
    assert alone.returncode == 0, alone.stderr[-3000:]
    joined = run_snakemake(work, *profile(work), *partition, "-n", env=env)
    assert joined.returncode == 0, joined.stderr[-3000:]
    before, after = planned_jobs(alone.stdout), planned_jobs(joined.stdout)
    inference = after["structure_inference"]
    assert len(inference) == 3
    for job in inference:
        assert job[0].endswith(VALIDATIONS) and "--data_directory=weights \\" in job
        assert "slurm_partition=gpu-training,gpu-el8" in next(line for line in job if "resources:" in line)
        assert not any("jax_compilation_cache_dir" in line for line in job), job
    (target,) = after["all"]
    assert target[0].endswith(", results/gpu-cache/summary.txt")
    assert_host_jobs_alike(before, after)
    # gpu-cache's jobs: the host's partition (as changed), image and weights; memory for the
    # buckets they run at once (warm: 128 and 256 side by side) or one at a time (check).
    one = {n: run_memory_mb("alphafold3", True, n) for n in (128, 256)}
    for gpu_type in ("3090", "a100"):
        (warm,) = [job for job in after["gpu_cache_warm_cache"] if f"wildcards: gpu_type={gpu_type}" in job]
        (check,) = [job for job in after["gpu_cache_check_cache"] if f"wildcards: gpu_type={gpu_type}" in job]
        resources = next(line for line in warm if line.startswith("resources:"))
        assert "slurm_partition=gpu-training,gpu-el8" in resources
        assert f"mem_mb={one[128] + one[256]}," in resources, resources
        assert f"mem_mb={one[256]}," in next(line for line in check if line.startswith("resources:"))
        command = next(line for line in warm if "gpu_cache.core.runner" in line)
        assert "--model-dir weights" in command
        assert '"container": "docker://gpu-cache-test/bullseye-py39-jax0430"' in command


#: The inputs the module adds to each structure_inference job: every type's verdict.
VALIDATIONS = ", results/gpu-cache/validate/3090.json, results/gpu-cache/validate/a100.json"


def assert_host_jobs_alike(before: dict, after: dict) -> None:
    """Every job of the host's rules planned ``after`` is one planned ``before`` but for the
    verdicts it waits for and the summary its target builds."""
    def host_view(job: list[str]) -> list[str]:
        summary = ", results/gpu-cache/summary.txt"
        return [line.replace(VALIDATIONS, "").replace(summary, "") for line in job]

    for rule in HOST_RULES:
        assert before[rule], rule
        assert sorted(map(host_view, after[rule])) == sorted(before[rule]), rule


def test_a_batchs_own_cache_flag_is_gpu_caches_and_alphafold2_gets_none(container_root, tmp_path):
    """Batches of two folds: the host passes AlphaFold 3 its own --jax_compilation_cache_dir; the
    module points it at gpu-cache's folder (the host's where a job has none). An AlphaFold 2
    backend gets no such flag from the host, and none from gpu-cache: its jobs are the host's."""
    work = aps_copy(tmp_path)
    env = aps_environ(container_root, GPU_CACHE_ROOT=str(tmp_path / "cache"))
    write_yaml(work / "config" / "batches.yaml", {"batch_size": 2})
    own = str(work / "output" / ".jax_compilation_cache")
    batches = ("--configfile", "config/test.yaml", "config/batches.yaml")
    alone = planned_jobs(run_snakemake(work, *profile(work, *batches), "-n", env=env).stdout)
    settings = ("config/gpu-cache.yaml", "config/test-gpu-cache.yaml")
    joined = run_snakemake(work, *profile(work, *batches, *settings), "-n", env=env)
    assert joined.returncode == 0, joined.stderr[-3000:]
    host = f"--jax_compilation_cache_dir={own}"
    pointed = f'"--jax_compilation_cache_dir=${{JAX_COMPILATION_CACHE_DIR:-{own}}}"'
    for job in alone["structure_inference"]:
        assert any(host in line for line in job), job
    for job in planned_jobs(joined.stdout)["structure_inference"]:
        assert any(pointed in line for line in job) and not any(host + " " in line for line in job), job
    assert_host_jobs_alike(alone, planned_jobs(joined.stdout.replace(pointed, host)))
    # AlphaFold 2: the host adds --allow_resume, never the JAX flag; gpu-cache adds nothing.
    af2_backend = {"structure_inference_arguments": {"--fold_backend": "alphafold2"}}
    write_yaml(work / "config" / "af2.yaml", af2_backend)
    af2 = (*batches, "config/af2.yaml")
    alone = run_snakemake(work, *profile(work, *af2), "-n", env=env)
    joined = run_snakemake(work, *profile(work, *af2, *settings), "-n", env=env)
    assert joined.returncode == 0, joined.stderr[-3000:]
    assert "jax_compilation_cache_dir" not in joined.stdout and "--allow_resume=true" in joined.stdout
    assert_host_jobs_alike(planned_jobs(alone.stdout), planned_jobs(joined.stdout))


def test_settings_without_the_module_block_change_no_job(container_root, tmp_path):
    """The settings file passed, the Snakefile's block forgotten: the host's jobs are exactly its
    own (no empty cache flag, nothing waits for a verdict), batches of one fold or of two."""
    work = aps_copy(tmp_path)
    snakefile = work / "workflow" / "Snakefile"
    text = snakefile.read_text()
    snakefile.write_text(text[:text.index("# --- gpu-cache")])
    write_yaml(work / "config" / "batches.yaml", {"batch_size": 2})
    env = aps_environ(container_root, GPU_CACHE_ROOT=str(tmp_path / "cache"))
    for batches in (("config/test.yaml",), ("config/test.yaml", "config/batches.yaml")):
        alone = run_snakemake(work, *profile(work, "--configfile", *batches), "-n", env=env)
        joined = run_snakemake(work, *profile(work, "--configfile", *batches, "config/gpu-cache.yaml",
                                              "config/test-gpu-cache.yaml"), "-n", env=env)
        assert joined.returncode == 0, joined.stderr[-3000:]
        # (in any order: Snakemake lists the jobs of a rule in an order of its own, run to run)
        assert {rule: sorted(jobs) for rule, jobs in planned_jobs(joined.stdout).items()} == \
            {rule: sorted(jobs) for rule, jobs in planned_jobs(alone.stdout).items()}
    assert not (tmp_path / "cache").exists()


#: What stops a run whose host config/config.yaml got the older README's block pasted at its end.
DROPPED = ("gpu-cache: config: config/config.yaml gives structure_inference_arguments twice, the second from "
           "an older README of gpu-cache, which replaces the first: every job would lose --fold_backend. "
           "Delete the pasted block; gpu-cache's settings go in a file of their own, passed with "
           "--configfile (config/gpu-cache.yaml, README)")


def test_settings_pasted_into_the_hosts_config_stop_the_run_where_they_drop_its_arguments(
        container_root, tmp_path):
    """An older README's block pasted at the end of the host's config/config.yaml (gpu-cache's
    settings and structure_inference_arguments with the flag as $JAX_COMPILATION_CACHE_DIR) gives
    that mapping twice: YAML keeps the second, so every job would lose --fold_backend (which picks
    the structure's backend). A 521-character warning let the run go on; now the dry run and the
    run stop before any job with one line and the fix. gpu-cache's settings pasted alone drop
    nothing: one warning says where they go."""
    work = aps_copy(tmp_path)
    host = work / "config" / "config.yaml"
    original = host.read_text()
    settings = yaml.safe_load((work / "config" / "gpu-cache.yaml").read_text())
    flag = {"--jax_compilation_cache_dir": "$JAX_COMPILATION_CACHE_DIR"}
    # (an older README's block: gpu_cache_workflow named the checkout's Snakefile)
    old = {**settings, "gpu_cache_workflow": "/path/to/gpu-cache/workflow/Snakefile"}
    host.write_text(original + "\n" + yaml.safe_dump({**old, "structure_inference_arguments": flag}))
    env = aps_environ(container_root, GPU_CACHE_ROOT=str(tmp_path / "cache"))
    tests_own = ("--configfile", "config/test.yaml", "config/test-gpu-cache.yaml")
    for dry in (("-n",), ()):
        done = run_snakemake(work, *profile(work, *tests_own), *dry, env=env)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
        assert [line for line in done.stderr.splitlines() if line.startswith("gpu-cache")] == [DROPPED]
    assert not (work / "results").exists() and not (work / "output" / "predictions").exists()
    host.write_text(original + "\n" + yaml.safe_dump(old))
    dry = run_snakemake(work, *profile(work, *tests_own), "-n", env=env)
    assert dry.returncode == 0, dry.stderr[-3000:]
    (line,) = [line for line in dry.stderr.splitlines() if "holds gpu-cache's settings" in line]
    assert line == ("gpu-cache: warning: config/config.yaml holds gpu-cache's settings (gpu_cache, "
                    "gpu_cache_workflow), as an older README had them: move them into a file of their own, "
                    "passed with --configfile (config/gpu-cache.yaml, README)")
    # The settings file in its place says nothing.
    clean = run_snakemake(work := aps_copy(tmp_path / "clean"), *profile(work), "-n", env=env)
    assert "holds gpu-cache's settings" not in clean.stderr


def test_the_warm_only_target_warms_and_validates_and_runs_nothing_else(container_root, tmp_path):
    work = aps_copy(tmp_path)
    env = aps_environ(container_root, GPU_CACHE_ROOT=str(tmp_path / "cache"))
    dry = run_snakemake(work, *profile(work), "-n", "gpu_cache_warm", env=env)
    assert dry.returncode == 0, dry.stderr[-3000:]
    jobs = job_counts(dry)
    jobs.pop("total")
    warming = {"gpu_cache_preflight_cache": "1", "gpu_cache_warm_cache": "2", "gpu_cache_check_cache": "2",
               "gpu_cache_validate_cache": "2", "gpu_cache_warm": "1"}
    assert jobs == warming, dry.stdout


def test_a_module_block_above_the_hosts_rules_says_where_it_goes(container_root, tmp_path):
    work = aps_copy(tmp_path)
    snakefile = work / "workflow" / "Snakefile"
    text = snakefile.read_text()
    block = text[text.index("# --- gpu-cache"):]
    above = "# declare"  # the generated Snakefile's line above the pipeline's module
    snakefile.write_text(text.replace(block, "").replace(above, block + "\n\n" + above, 1))
    env = aps_environ(container_root, GPU_CACHE_ROOT=str(tmp_path / "cache"))
    dry = run_snakemake(work, *profile(work), "-n", env=env)
    assert dry.returncode == 1
    assert dry.stderr.strip().splitlines()[-1] == (
        "gpu-cache: config: config key host_rules: the host has no rule structure_inference above "
        "gpu-cache's module block; put the block at the end of the Snakefile, after every rule")


def test_the_readme_module_section_is_what_the_fixture_uses():
    """The README's settings file is the look-alike's config/gpu-cache.yaml as it is, its
    Snakefile block is what the tests add to the deployed folder's Snakefile (aps_copy), and its
    command passes the file."""
    (settings,) = readme_blocks("yaml")
    assert settings == (FIXTURE / "config" / "gpu-cache.yaml").read_text()
    # The block names gpu-cache's workflow by tag; the pipeline's own files do not name it.
    (block,) = readme_blocks("python")
    assert block.count(README_MODULE) == 1
    assert not [p for p in FIXTURE.rglob("*") if p.is_file() and "gpu_cache" in p.read_text(errors="replace")
                and p.parent.name != "config"]
    assert "--configfile config/gpu-cache.yaml" in "".join(readme_blocks("bash"))
    # No --buckets: the jobs pad to AlphaPulldown's buckets, and the warm compiles some of them.
    host = yaml.safe_load((FIXTURE / "config" / "config.yaml").read_text())
    assert "--buckets" not in host["structure_inference_arguments"]
    ours = yaml.safe_load(settings)["gpu_cache"]
    assert set(ours["workloads"]["alphafold3"]["shapes"]) <= set(ALPHAPULLDOWN_BUCKETS)
    assert "script" not in ours["workloads"]["alphafold3"]  # found in the image
    # The host's values by reference, never copied.
    for spec in ours["gpu_types"].values():
        assert spec["container"] == {"host": "prediction_container"}
        assert spec["resources"]["slurm_partition"] == {"host": "slurm_partition"}
    assert ours["workloads"]["alphafold3"]["model_dir"] == {"host": "backend_weights_directory"}


#: AlphaPulldown's default --buckets (alphapulldown/scripts/run_structure_prediction.py, 2.6.2).
ALPHAPULLDOWN_BUCKETS = (128, 256, 512, 768, 1024, 1280, 1536, 2048, 2560, 3072, 3584, 4096, 4608, 5120)

def write_record(root: Path, name: str, **fields) -> None:
    (root / "records").mkdir(parents=True, exist_ok=True)
    record = {"time": 1.0, "rule": None, "gpu_type": None, "env": {}, "device": {}} | fields
    (root / "records" / f"{name}.json").write_text(json.dumps(record))


def test_stats_by_device_folders_outside_the_root_and_no_negative_seconds_saved(tmp_path):
    """What stats makes of records (written here, as the hook writes them): the device a
    job of unknown type got, a folder set outside gpu-cache, and JAX's negative
    "compile time saved" (retrieval slower than the compile) shown as not measured."""
    root = tmp_path / "cache"
    h100 = {"kinds": ["NVIDIA H100 80GB HBM3"], "count": 1}
    software_warm = {"python": "3.12.1", "jax": "0.9.1"}
    write_record(root, "warm", rule="warm_cache", gpu_type="h100", device=h100, software=software_warm,
                 jax={"hits": 0, "misses": 4, "cache_dir": str(root / "jax")})
    write_record(root, "a100-warm", rule="warm_cache", gpu_type="a100",
                 device={"kinds": ["NVIDIA A100-SXM4-80GB"]}, software={"python": "3.11.7", "jax": "0.10.2"},
                 jax={"hits": 0, "misses": 4, "cache_dir": str(root / "jax")})
    mine = "/scratch/mine/jax"
    write_record(root, "job", rule="structure_inference", device=h100, software=software_warm,
                 env={"JAX_COMPILATION_CACHE_DIR": mine},
                 jax={"hits": 3, "misses": 1, "saved_seconds": -2.5, "cache_dir": mine})
    stats = json.loads(run_cli("stats", "--json", "--cache-root", str(root)).stdout)
    assert stats["usage"]["by_device"]["h100"]["processes"] == 2
    assert stats["usage"]["by_gpu_type"]["-"]["processes"] == 1
    # The job of unknown type ran on an h100, with the software that warmed h100: no mismatch
    # (a100 was warmed with other software, but the job did not run there).
    assert stats["software_mismatches"] == []
    (line,) = stats["outside_root"]
    assert line.startswith(f"rule structure_inference used {mine} (outside the cache root {root})")
    assert "its JAX_COMPILATION_CACHE_DIR was set outside gpu-cache: unset it" in line
    text = run_cli("stats", "--cache-root", str(root)).stdout
    # JAX's estimate of the time saved is negative: not "0.0 s saved", which reads as no gain.
    assert ("structure_inference: 3 hits, 1 misses (75% hit rate), time saved not measured, "
            "1 processes") in text
    assert not re.search(r"[0-9.]+ s saved", text)
