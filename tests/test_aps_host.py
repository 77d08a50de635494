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
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from gpu_cache.config.memory import run_memory_mb
from helpers import REPO, SNAKEFILE, read_json, run_cli, run_snakemake
from release import TAG, released_repo, tagged_repo

FIXTURE = REPO / "tests" / "aps_host"
#: The host's config changed for a machine without a GPU (config/test.yaml); then gpu-cache's
#: settings as the README has them, and what the tests change in those.
HOST_ONLY = ("--configfile", "config/test.yaml")
WITH_GPU_CACHE = ("--configfile", "config/test.yaml", "config/gpu-cache.yaml", "config/test-gpu-cache.yaml")
#: Where AlphaPulldown's AlphaFold 3 images keep AlphaFold 3 (docker/alphafold3.dockerfile,
#: 2.1.8 to 2.6.2): the tests bind the stand-in run_alphafold.py (tests/fixtures) there, so
#: the image has it where the real ones do.
IMAGE_AF3 = "/app/AlphaPulldown/alphafold3"
#: Where the tests put the pipeline's own stand-ins in the image (on its PATH).
IMAGE_BIN = "/app/AlphaPulldown/bin"
#: Longest a run of the look-alike through SLURM may take.
SLURM_TIMEOUT = 600
#: The host's own jobs (rules), whose every value must stay as the host made it.
HOST_RULES = ("all", "structure_inference", "analyze_structure", "recursive_report")


#: The pipeline's release its users deploy (AlphaPulldownSnakemake's README).
APS_TAG = "2.6.2"
#: How the README's block names gpu-cache's workflow (a module by tag).
README_MODULE = f'github("OWNER/gpu-cache", path="workflow/Snakefile", tag="{TAG}")'


def aps_copy(tmp_path: Path, by_tag: bool = False) -> Path:
    """The folder `snakedeploy deploy-workflow <pipeline> DEST --tag 2.6.2` makes (written by
    snakedeploy: config/ copied, workflow/Snakefile with the pipeline as a module), the project's
    data beside it, and the README's block at the end of its Snakefile. ``by_tag``: both modules
    by tag from git repositories; else by path (the fixture's Snakefile, the checkout's)."""
    work = tmp_path / "aps"
    deploy = subprocess.run([sys.executable, "-m", "snakedeploy.client", "deploy-workflow", str(FIXTURE),
                             str(work), "--tag", APS_TAG, "--name", "AlphaPulldownSnakemake"],
                            capture_output=True, text=True, timeout=300)
    assert deploy.returncode == 0, deploy.stderr[-2000:]
    for data in ("data", "weights"):
        shutil.copytree(FIXTURE / data, work / data)
    if by_tag:
        aps = tagged_repo(FIXTURE, tmp_path / "AlphaPulldownSnakemake.git", APS_TAG)
        pipeline = f'gitfile("{aps}", path="workflow/Snakefile", tag="{APS_TAG}")'
        ours = f'gitfile("{released_repo(tmp_path)}", path="workflow/Snakefile", tag="{TAG}")'
    else:
        pipeline, ours = f'"{FIXTURE / "workflow" / "Snakefile"}"', f'"{SNAKEFILE}"'
    snakefile = work / "workflow" / "Snakefile"
    generated = snakefile.read_text()
    assert '"workflow/Snakefile"' in generated  # snakedeploy's path for a local source
    (block,) = readme_blocks("python")
    snakefile.write_text(generated.replace('"workflow/Snakefile"', pipeline) + "\n\n"
                         + block.replace(README_MODULE, ours))
    return work


def profile(work: Path, *settings: str) -> tuple[str, ...]:
    """The look-alike's desktop profile, 2 cores, its images pulled into the copy, ``settings``
    (default: with gpu-cache)."""
    images = str(work / "images")
    return ("--profile", "config/profiles/desktop", "--cores", "2", "--apptainer-prefix", images,
            *(settings or WITH_GPU_CACHE))


def write_yaml(path: Path, document: dict) -> None:
    path.write_text(yaml.safe_dump(document))


def aps_environ(container_root, **extra: str) -> dict[str, str]:
    """The environment of a run of the look-alike: the container stand-in first on PATH, and
    AlphaFold 3's stand-in in the image where AlphaPulldown's images keep it, the pipeline's
    own stand-ins on the image's PATH (run_structure_prediction.py, alphajudge)."""
    binds = f"{REPO / 'tests' / 'fixtures'}:{IMAGE_AF3}:ro,{FIXTURE / 'workflow' / 'scripts'}:{IMAGE_BIN}:ro"
    return container_root.environ(APPTAINER_BIND=binds, APPTAINERENV_PREPEND_PATH=IMAGE_BIN, **extra)


def records(root: Path, rule: str | None = None) -> list[dict]:
    found = [json.loads(p.read_text()) for p in sorted((root / "records").glob("*.json"))]
    return [r for r in found if rule is None or r.get("rule") == rule]


def predictions(work: Path) -> dict[str, dict]:
    found = (work / "output" / "predictions").glob("*/ranking_debug.json")
    return {p.parent.name: read_json(p) for p in found}


def job_counts(dry: subprocess.CompletedProcess[str]) -> dict[str, str]:
    return dict(re.findall(r"^(\S+)\s+(\d+)$", dry.stdout, re.MULTILINE))


def planned_jobs(text: str) -> dict[str, list[list[str]]]:
    """The jobs a dry run with printshellcmds lists, by rule: each its lines (what it reads and
    writes, wildcards, threads, resources, its shell command), without its job id and reason."""
    jobs: dict[str, list[list[str]]] = {}
    lines: list[str] | None = None
    for line in text.splitlines():
        start = re.match(r"^(?:local)?(?:rule|checkpoint) (\S+):$", line)
        if start:
            lines = []
            jobs.setdefault(start.group(1), []).append(lines)
        elif line.startswith(("[", "Job stats")):
            lines = None
        elif lines is not None and line.strip() and not line.strip().startswith(("jobid:", "reason:")):
            lines.append(line.strip())
    return jobs


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


def readme_section() -> str:
    text = (REPO / "README.md").read_text()
    return text.split("## Use it inside a pipeline, as a Snakemake module", 1)[1].split("\n## ", 1)[0]


def readme_blocks(language: str) -> list[str]:
    """The code blocks of README.md's module section in ``language``."""
    return re.findall(rf"```{language}\n(.*?)```", readme_section(), re.DOTALL)


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


def test_plain_snakemake_runs_the_hosts_target_with_gpu_cache_in_front(container_root, unbound_dir, tmp_path):
    root = unbound_dir / "cache"
    work = aps_copy(tmp_path)
    env = aps_environ(container_root, GPU_CACHE_ROOT=str(root))
    run = run_snakemake(work, *profile(work), env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    # The warm found AlphaFold 3's run_alphafold.py in the image (no script: in the config).
    log = (work / "logs" / "gpu-cache" / "warm" / "3090.log").read_text()
    assert f"alphafold3: using {IMAGE_AF3}/run_alphafold.py, found in the image" in log
    results = work / "results" / "gpu-cache"
    validations = [results / "validate" / f"{t}.json" for t in ("3090", "a100")]
    for path in validations:
        verdict = read_json(path)
        assert verdict["status"] == "passed", verdict["problems"]
        assert verdict["software"]["jax"] == container_root.jax_version  # warmed in the image
    # The host's target was built: every batch predicted, after every type's validation,
    # each served by the warmed cache in the image, through the bind gpu-cache added next to
    # the host's APPTAINER_BINDPATH; the report, then the prune.
    done = sorted((work / "output" / "predictions").glob("*/completed_fold.txt"))
    assert [p.parent.name for p in done] == ["A+B", "B", "C"]
    finished = max(p.stat().st_mtime for p in done)
    assert min(p.stat().st_mtime for p in done) >= max(v.stat().st_mtime for v in validations)
    report = work / "output" / "reports" / "all_interfaces.csv"
    assert (results / "prune.json").stat().st_mtime >= report.stat().st_mtime
    # No --buckets: the folds padded to AlphaPulldown's buckets, both warmed. The jobs kept the
    # host's flags and weights.
    assert {f: p["bucket"] for f, p in predictions(work).items()} == {"A+B": 256, "B": 128, "C": 128}
    for fold, prediction in predictions(work).items():
        assert prediction["fold_backend"] == "alphafold3" and prediction["data_directory"] == "weights"
        assert prediction["cache"]["requests"] > 0
        assert prediction["cache"]["hits"] == prediction["cache"]["requests"], fold
        assert prediction["cache_dir_used"] == str(root / "jax")
    summary = (results / "summary.txt").read_text()
    assert summary.count("PASSED") == 2
    # Each type's line says what was validated: the image as the config names it (not the
    # file Snakemake pulled it to) and the jax that ran in it.
    validated = (f"validated jax {container_root.jax_version} (Python {container_root.python_version}) "
                 f"in {container_root.image}")
    assert "3090 on cpu: PASSED" in summary and summary.count(validated) == 2, summary
    # The jobs' records: a local job of the host names no rule (its shell does not export
    # GPU_CACHE_RULE), nor a GPU type (any GPU of the partition).
    jobs = records(root, None)
    host_jobs = [r for r in jobs if r.get("rule") is None]
    assert len(host_jobs) == 3 and all(r["gpu_type"] is None for r in host_jobs)
    stats = json.loads(run_cli("stats", "--json", "--cache-root", str(root)).stdout)
    assert stats["usage"]["by_rule"]["-"]["jax_misses"] == 0
    assert stats["usage"]["by_device"]["cpu"]["processes"] == len(jobs)
    assert stats["software_mismatches"] == [] and stats["outside_root"] == []

    # Batches of two folds, with settings whose module joins no host rule (host_rules: []): the
    # jobs pass their own --jax_compilation_cache_dir, which gpu-cache then does not point at its
    # folder. And a GPU type whose warm runs with a Python that has no jax (as Snakemake's own).
    write_yaml(work / "config" / "batches.yaml", {"batch_size": 2})
    settings = yaml.safe_load((work / "config" / "gpu-cache.yaml").read_text())
    settings["gpu_cache"]["host_rules"] = []
    settings["gpu_cache"]["gpu_types"]["l4"] = {"python": "/usr/bin/python3", "device": "cpu",
                                                "workloads": ["alphafold3"], "resources": {"runtime": 60}}
    write_yaml(work / "config" / "without-flag.yaml", settings)
    # --forcerun: the host's profile reruns on mtime alone, where new batches change no file's
    # time; without a host job to run, no job waits for l4's verdict and Snakemake plans none.
    second = run_snakemake(work, *profile(work, "--configfile", "config/test.yaml", "config/batches.yaml",
                                          "config/without-flag.yaml", "config/test-gpu-cache.yaml"),
                           "--forcerun", "structure_inference", env=env, timeout=600)
    # The workloads of l4 could not start: an error at the end of the run, with its cause...
    assert second.returncode != 0
    assert "gpu-cache: ERROR: GPU type l4: no workload run" in second.stderr
    missing = "alphafold3: error: found no run_alphafold.py (looked at /app/alphafold/run_alphafold.py"
    assert missing in second.stderr
    verdict = read_json(results / "validate" / "l4.json")
    assert verdict["status"] == "error" and verdict["passed"] is False
    assert missing in verdict["problems"][0]
    assert all(run["error"] for run in verdict["runs"])
    # ... after the host's jobs ran anyway (they only missed a warm cache for l4).
    batches = {p.parent.name: p.stat().st_mtime
               for p in (work / "output" / "predictions").glob("*/completed_fold.txt")}
    assert batches["C"] > finished
    # Those jobs used their own folder: the records show it, stats and doctor name it.
    outside = str(work / "output" / ".jax_compilation_cache")
    assert {p["cache_dir_used"] for f, p in predictions(work).items() if f in ("C", "B")} == {outside}
    stats = json.loads(run_cli("stats", "--json", "--cache-root", str(root)).stdout)
    (line,) = stats["outside_root"]
    assert line.startswith(f"rule - used {outside} (outside the cache root {root})")
    assert "drop that flag or point it at $JAX_COMPILATION_CACHE_DIR" in line
    assert f"outside the cache root: {line}" in run_cli("stats", "--cache-root", str(root)).stdout
    doctor = run_cli("doctor", "--json", "--no-fail", "--cache-root", str(root))
    assert json.loads(doctor.stdout)["outside_root"] == [line]
    # Every miss stats counts, doctor --explain accounts for, by rule: those jobs' misses are
    # in their own folder. --json's explain names the latest process's misses key by key (the
    # hook names jax 0.4.30's misses, which that jax itself logs nowhere).
    assert_explained(root)
    (inference,) = explained(root)["-"]
    assert inference["cause"] == line
    report = json.loads(run_cli("doctor", "--explain", "--json", "--cache-root", str(root)).stdout)
    assert report["explain"] and all(item["causes"] for item in report["explain"]), report

    # The README's settings (the module joins structure_inference and points the batches' own
    # flag at gpu-cache's folder): the jobs hit gpu-cache's folder again.
    third = run_snakemake(work, *profile(work, "--configfile", "config/test.yaml", "config/batches.yaml",
                                         "config/gpu-cache.yaml", "config/test-gpu-cache.yaml"),
                          "--forcerun", "structure_inference", env=env, timeout=600)
    assert third.returncode == 0, third.stderr[-4000:]
    for prediction in predictions(work).values():
        assert prediction["cache_dir_used"] == str(root / "jax")
        assert prediction["cache"]["hits"] == prediction["cache"]["requests"] > 0
    # The finding no longer holds: stats still shows it, with when it was last seen; doctor
    # no longer warns; explain's cause for those old misses says the same.
    stats = json.loads(run_cli("stats", "--json", "--cache-root", str(root)).stdout)
    (stale,) = stats["outside_root"]
    assert stale.startswith(f"rule - used {outside} (outside the cache root {root})")
    assert "; last seen " in stale and stale.endswith("since used the cache root")
    assert "no longer: its " in stale and "drop that flag" not in stale
    doctor = json.loads(run_cli("doctor", "--json", "--no-fail", "--cache-root", str(root)).stdout)
    assert doctor["outside_root"] == [] and not any(outside in w for w in doctor["warnings"])
    assert_explained(root)
    assert explained(root)["-"][0]["cause"].split("; last seen")[0] == stale.split("; last seen")[0]


def test_a_second_folder_on_the_same_root_only_validates(container_root, unbound_dir, tmp_path):
    """README: a run in another folder on the same root skips warming while the last verdict
    holds (and its log says why), here with the image's jax 0.4.30 (whose hits the startup
    hook names from its cache reads) and though each folder pulls the image to a file of its
    own."""
    root = unbound_dir / "cache"
    env = aps_environ(container_root, GPU_CACHE_ROOT=str(root))
    warms = {}
    for name in ("one", "two", "three"):
        if name == "three":  # an entry the validation hit is gone (pruned): warm again
            hit = next(k for r in records(root, "validate_cache") for k in r["jax"]["hit_keys"])
            (root / "jax" / hit).unlink()
        work = aps_copy(tmp_path / name)
        run = run_snakemake(work, *profile(work), env=env, timeout=600)
        assert run.returncode == 0, run.stderr[-4000:]
        results = work / "results" / "gpu-cache"
        warms[name] = {t: read_json(results / "warm" / f"{t}.json") for t in ("3090", "a100")}
        for gpu_type in ("3090", "a100"):
            assert read_json(results / "validate" / f"{gpu_type}.json")["status"] == "passed"
        for prediction in predictions(work).values():
            assert prediction["cache"]["hits"] == prediction["cache"]["requests"] > 0
        if name == "two":
            log = (work / "logs" / "gpu-cache" / "warm" / "3090.log").read_text()
            assert log == f"# warm [3090]: no workload run: skipped: {warms['two']['3090']['skipped']}\n"
            # The preflight's one placement line a type (the skip and the sizes printed two).
            preflight = (work / "logs" / "gpu-cache" / "preflight.log").read_text().splitlines()
            placed = [line for line in preflight if line.startswith("placement: ")]
            assert [line.split(":")[1] for line in placed] == [" 3090", " a100"], placed
            assert "its warm job runs no workload and asks for no GPU" in placed[0] and "; check one at a " \
                "time in " in placed[0], placed
    assert not any(w["skipped"] for w in warms["one"].values())
    for warm in warms["two"].values():
        assert warm["skipped"].startswith("the last validation of the same workloads")
        assert warm["runs"] == []
    assert warms["two"]["3090"]["software"]["image"] != warms["one"]["3090"]["software"]["image"]
    # The warm was planned to run nothing (no GPU asked); the check job confirmed it on its node:
    # the same fingerprint as the first folder's, though the image is another file.
    confirmed = read_json(tmp_path / "two" / "aps" / "results" / "gpu-cache" / "check" / "3090.json")["warm"]
    assert confirmed["skipped"] and confirmed["runs"] == []
    assert confirmed["fingerprint"] == warms["one"]["3090"]["fingerprint"]
    # The first type to warm again writes the entry back: the other may then find it there.
    again = [w for w in warms["three"].values() if not w["skipped"]]
    assert again and again[0]["new_entries"]["jax"] == 1


def explained(root: Path) -> dict[str, list[dict]]:
    """``doctor --explain``'s causes of JAX misses, by rule."""
    report = json.loads(run_cli("doctor", "--explain", "--json", "--cache-root", str(root)).stdout)
    return {group["rule"]: group["causes"] for group in report["by_rule"] if group["kind"] == "jax"}


def assert_explained(root: Path) -> None:
    """Every JAX miss `gpu-cache stats` counts per rule is in `doctor --explain`, by cause."""
    usage = json.loads(run_cli("stats", "--json", "--cache-root", str(root)).stdout)["usage"]["by_rule"]
    causes = explained(root)
    assert {rule for rule, u in usage.items() if u["jax_misses"]} == set(causes)
    for rule, counts in usage.items():
        assert sum(c["misses"] for c in causes.get(rule, [])) == counts["jax_misses"], (rule, causes)


@pytest.mark.slurm
def test_on_slurm_a_type_the_partition_lacks_holds_no_prediction_back(slurm_cluster, container_root,
                                                                      unbound_dir, tmp_path):
    """The look-alike through SLURM with the README's command (its profile, like
    AlphaPulldownSnakemake's, needs --jobs): two GPU types named as SLURM names them, h100, which
    the partition has, and h200, which it lacks. Neither says optional: a type with SLURM
    resources is optional by default (#25), so h200's rejected warm job ends unscheduled at once
    and the predictions (on any GPU of the partition) run after h100's validation. Neither sets
    mem_mb: their jobs ask for what one process of each bucket needs, fitted to the node. A bucket
    larger than the node (1280 tokens: 16.7 GiB) is named before any job and in h100's verdict,
    and the buckets that fit are warmed (it left the whole type unwarmed)."""
    partition = slurm_cluster.partition
    work = aps_copy(tmp_path, by_tag=True)
    write_yaml(work / "config" / "cluster.yaml", {"slurm_partition": partition})
    settings = yaml.safe_load((work / "config" / "gpu-cache.yaml").read_text())
    settings["gpu_cache"]["gpu_types"] = {
        name: {"container": {"host": "prediction_container"}, "device": "cpu", "workloads": ["alphafold3"],
               "resources": {"slurm_partition": {"host": "slurm_partition"}, "gpu": 1, "gpu_model": name,
                             "runtime": 10}}
        for name in ("h100", "h200")}
    write_yaml(work / "config" / "gpu-cache.yaml", settings)
    (work / "config" / "test-gpu-cache.yaml").write_text(
        "gpu_cache: {workloads: {alphafold3: {shapes: [128, 256, 1280]}}, validate: {measure_cold: false}}\n")
    root = unbound_dir / "cache"
    env = aps_environ(container_root, GPU_CACHE_ROOT=str(root), SLURM_CONF=slurm_cluster.env["SLURM_CONF"])
    # The README's command as it is, its --configfile list extended with the tests' own files.
    (readme,) = [line for block in readme_blocks("bash") for line in block.splitlines()
                 if line.startswith("snakemake --profile config/profiles/slurm")]
    assert readme.endswith(" --configfile config/gpu-cache.yaml"), readme
    command = [sys.executable, "-m", *shlex.split(readme), "config/test.yaml", "config/cluster.yaml",
               "config/test-gpu-cache.yaml", "--apptainer-prefix", str(work / "images"),
               "--slurm-init-seconds-before-status-checks", "1", "--nocolor"]
    started = time.time()
    process = subprocess.Popen(command, cwd=work, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    log = slurm_cluster.finish(process, SLURM_TIMEOUT)
    assert process.returncode == 0, log[-5000:]
    results = work / "results" / "gpu-cache"
    verdict = read_json(results / "validate" / "h100.json")
    assert verdict["status"] == "passed"
    assert [run["shape"] for run in verdict["runs"]] == [128, 256]
    over = ("GPU type h100: one run of alphafold3 at shape 1280 needs 16.7 GiB, more than the largest node "
            "that can take it has (15.6 GiB): it is left out of the type's warm and check jobs")
    assert [note for note in verdict["notes"] if note.startswith(over)], verdict["notes"]
    before = log[:log.index("Building DAG of jobs")]  # said before any job
    assert [line for line in before.splitlines() if line.startswith("gpu-cache: PROBLEM:")] == [
        f"gpu-cache: PROBLEM: {note}" for note in verdict["notes"] if note.startswith(over)]
    # h100's warm job asked for its two buckets side by side (they fit the 16000 MB node).
    warm = read_json(results / "warm" / "h100.json")
    one = [run_memory_mb("alphafold3", True, n) for n in (128, 256)]
    assert sum(one) <= slurm_cluster.real_memory_mb
    rows = slurm_cluster.wait_accounted(warm["job"]["slurm_job_id"], ["ReqMem", "AllocTRES"])
    assert rows[0]["ReqMem"] == f"{sum(one)}M" and "gres/gpu:h100=1" in rows[0]["AllocTRES"], rows
    h200 = results / "validate" / "h200.json"
    assert read_json(h200)["status"] == "unscheduled"
    assert read_json(results / "warm" / "h200.json")["unscheduled"].startswith(
        "its job did not finish on an H200 node")
    # Unscheduled at once (sbatch rejected it), not after its queue_wait (2 h) and runtime.
    assert h200.stat().st_mtime - started < SLURM_TIMEOUT
    done = sorted((work / "output" / "predictions").glob("*/completed_fold.txt"))
    assert [p.parent.name for p in done] == ["A+B", "B", "C"]
    summary = (results / "summary.txt").read_text()
    assert "h200: UNSCHEDULED (optional type)" in summary and "h100 on cpu: PASSED" in summary
    assert f"in {container_root.image}" in summary
    # The predictions ran as SLURM jobs on a GPU of the partition, hitting the warmed cache;
    # a SLURM job's records name its rule (from its --target-jobs).
    jobs = records(root, "structure_inference")
    assert len(jobs) == 3 and all(r["slurm_job_id"] for r in jobs)
    rows = slurm_cluster.wait_accounted(jobs[0]["slurm_job_id"])
    assert "gres/gpu" in rows[0]["AllocTRES"], rows
    for prediction in predictions(work).values():
        assert prediction["cache"]["hits"] == prediction["cache"]["requests"] > 0


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
