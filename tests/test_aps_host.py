"""gpu-cache as a module of an AlphaPulldownSnakemake-shaped host (tests/aps_host), as the
README's module section says: its own `rule all`, structure inference in a `container:`
rule (run through tests/bin/apptainer, the stand-in over bwrap: Python 3.9 and jax 0.4.30)
on any GPU of its partition (default gpu-el8), binds set with os.environ.setdefault at parse
time, no --buckets (the jobs pad to AlphaPulldown's own), batches that pass their own
--jax_compilation_cache_dir, and the built-in alphafold3 warm workload finding
run_alphafold.py where AlphaPulldown's images keep it (a stand-in, bound there).

Real Snakemake runs, a few seconds each; the cache root lies outside the container's
default binds, so the jobs see it only because gpu-cache binds it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from helpers import REPO, SNAKEFILE, read_json, run_cli, run_snakemake

FIXTURE = REPO / "tests" / "aps_host"
PROFILE_ARGS = ("--profile", "config/profiles/desktop", "--config", f"gpu_cache_workflow={SNAKEFILE}")
#: Where AlphaPulldown's AlphaFold 3 images keep AlphaFold 3 (docker/alphafold3.dockerfile,
#: 2.1.8 to 2.6.2): the tests bind the stand-in run_alphafold.py (tests/fixtures) there, so
#: the image has it where the real ones do.
IMAGE_AF3 = "/app/AlphaPulldown/alphafold3"
#: Longest a run of the look-alike through SLURM may take.
SLURM_TIMEOUT = 600


def aps_copy(tmp_path: Path, **changes) -> Path:
    """A copy of the fixture, with ``changes`` made to its config."""
    work = tmp_path / "aps"
    shutil.copytree(FIXTURE, work, ignore=shutil.ignore_patterns(".snakemake", "results", "logs", "output"))
    if changes:
        configure(work, **changes)
    return work


def configure(work: Path, **changes) -> None:
    path = work / "config" / "config.yaml"
    config = yaml.safe_load(path.read_text())
    for key, value in changes.items():
        config[key] = value
    path.write_text(yaml.safe_dump(config))


def aps_environ(container_root, **extra: str) -> dict[str, str]:
    """The environment of a run of the look-alike: the container stand-in first on PATH, and
    AlphaFold 3's stand-in in the image where AlphaPulldown's images keep it."""
    return container_root.environ(APPTAINER_BIND=f"{REPO / 'tests' / 'fixtures'}:{IMAGE_AF3}:ro", **extra)


def records(root: Path, rule: str | None = None) -> list[dict]:
    found = [json.loads(p.read_text()) for p in sorted((root / "records").glob("*.json"))]
    return [r for r in found if rule is None or r.get("rule") == rule]


def predictions(work: Path) -> dict[str, dict]:
    found = (work / "output" / "predictions").glob("*/ranking_debug.json")
    return {p.parent.name: read_json(p) for p in found}


def test_a_dry_run_and_lint_plan_the_hosts_target_and_create_no_cache_folder(container_root, tmp_path):
    work = aps_copy(tmp_path)
    root = tmp_path / "cache"
    env = aps_environ(container_root, GPU_CACHE_ROOT=str(root))
    dry = run_snakemake(work, *PROFILE_ARGS, "-n", env=env)
    assert dry.returncode == 0, dry.stderr[-3000:]
    # The host's own `rule all` is the default target (gpu-cache's `all` is not), with
    # gpu-cache's jobs in front of the inference.
    jobs = dict(re.findall(r"^(\S+)\s+(\d+)$", dry.stdout, re.MULTILINE))
    assert jobs.get("all") == "1" and "gpu_cache_all" not in jobs, dry.stdout
    assert jobs["structure_inference"] == "3" and jobs["gpu_cache_warm_cache"] == "2"
    assert jobs["gpu_cache_cache_report"] == "1"
    lint = run_snakemake(work, *PROFILE_ARGS, "--lint", env=env)
    assert "Traceback" not in lint.stderr, lint.stderr[-3000:]
    assert not root.exists(), "a dry run or --lint created the cache root"
    # gpu-cache adds no lint to the host: none for its rules, none for what the README has the
    # host write (the look-alike keeps the lints of its own shape, as AlphaPulldownSnakemake).
    found = lint.stdout + lint.stderr
    headers = re.findall(r"^Lints for (.*)$", found, re.MULTILINE)
    assert headers and not [h for h in headers if "gpu_cache_" in h or str(REPO / "workflow") in h], found
    assert "directly uses variable" not in found, found


def readme_section() -> str:
    text = (REPO / "README.md").read_text()
    return text.split("## Use it inside a pipeline, as a Snakemake module", 1)[1].split("\n## ", 1)[0]


def readme_blocks(language: str) -> list[str]:
    """The code blocks of README.md's module section in ``language`` (python: the Snakefile's)."""
    found = re.findall(rf"```{language}\n(.*?)```", readme_section(), re.DOTALL)
    return [block.strip("\n") for block in found]


def test_the_readme_module_section_is_what_the_fixture_uses():
    """Each Snakefile block of the README is a piece of the look-alike's Snakefile as it is,
    with the host lines around gpu-cache's that say where it goes (no `...`); the config
    block gives the look-alike's config its shape."""
    snakefile = (FIXTURE / "workflow" / "Snakefile").read_text()
    fragments = readme_blocks("python")
    assert len(fragments) >= 4 and not any("\n...\n" in f for f in fragments)
    for fragment in fragments:
        assert fragment in snakefile, fragment
    (example,) = readme_blocks("yaml")[:1]
    readme = yaml.safe_load(example)
    config = yaml.safe_load((FIXTURE / "config" / "config.yaml").read_text())
    assert set(config["gpu_cache"]) <= {"gpu_types", "workloads", "validate"}
    # The README's types warm on the predictions' partition with their image and weights, by
    # anchors on the host's own keys, as the look-alike's do.
    for spec in readme["gpu_cache"]["gpu_types"].values():
        assert spec["container"] == readme["prediction_container"]
        assert spec["resources"]["slurm_partition"] == readme["slurm_partition"] == "gpu-el8"
    assert readme["gpu_cache"]["workloads"]["alphafold3"]["model_dir"] == readme["backend_weights_directory"]
    for spec in config["gpu_cache"]["gpu_types"].values():
        assert spec["container"] == config["prediction_container"]
        assert spec["resources"]["slurm_partition"] == config["slurm_partition"] == "gpu-el8"
    assert config["gpu_cache"]["workloads"]["alphafold3"]["model_dir"] == config["backend_weights_directory"]
    # No --buckets: the jobs pad to AlphaPulldown's buckets, and the warm compiles some of them.
    assert "--buckets" not in config["structure_inference_arguments"]
    for shapes in (readme["gpu_cache"]["workloads"]["alphafold3"]["shapes"],
                   config["gpu_cache"]["workloads"]["alphafold3"]["shapes"]):
        assert set(shapes) <= set(ALPHAPULLDOWN_BUCKETS), shapes
    assert "script" not in readme["gpu_cache"]["workloads"]["alphafold3"]  # found in the image


#: AlphaPulldown's default --buckets (alphapulldown/scripts/run_structure_prediction.py, 2.6.2).
ALPHAPULLDOWN_BUCKETS = (128, 256, 512, 768, 1024, 1280, 1536, 2048, 2560, 3072, 3584, 4096, 4608, 5120)


def test_plain_snakemake_runs_the_hosts_target_with_gpu_cache_in_front(container_root, unbound_dir, tmp_path):
    root = unbound_dir / "cache"
    work = aps_copy(tmp_path)
    env = aps_environ(container_root, GPU_CACHE_ROOT=str(root))
    run = run_snakemake(work, *PROFILE_ARGS, env=env, timeout=600)
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
    # the host's APPTAINER_BINDPATH.
    done = sorted((work / "output" / "predictions").glob("*/completed_fold.txt"))
    assert [p.parent.name for p in done] == ["A+B", "B", "C"]
    finished = max(p.stat().st_mtime for p in done)
    assert min(p.stat().st_mtime for p in done) >= max(v.stat().st_mtime for v in validations)
    # No --buckets: the folds padded to AlphaPulldown's buckets, both warmed.
    assert {f: p["bucket"] for f, p in predictions(work).items()} == {"A+B": 256, "B": 128, "C": 128}
    for fold, prediction in predictions(work).items():
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
    # The jobs' records name their rule (GPU_CACHE_RULE=structure_inference) and the device they got;
    # their GPU type is unknown (any GPU of the partition).
    jobs = records(root, "structure_inference")
    assert len(jobs) == 3 and all(r["gpu_type"] is None for r in jobs)
    stats = json.loads(run_cli("stats", "--json", "--cache-root", str(root)).stdout)
    assert stats["usage"]["by_rule"]["structure_inference"]["jax_misses"] == 0
    assert stats["usage"]["by_device"]["cpu"]["processes"] == len(records(root))
    assert stats["software_mismatches"] == [] and stats["outside_root"] == []

    # Batches of two folds: the jobs pass their own --jax_compilation_cache_dir. And a GPU
    # type whose warm runs with a Python that has no jax (as Snakemake's own environment).
    configure(work, batch_size=2)
    config = yaml.safe_load((work / "config" / "config.yaml").read_text())
    config["gpu_cache"]["gpu_types"]["l4"] = {"python": "/usr/bin/python3", "device": "cpu",
                                              "workloads": ["alphafold3"], "resources": {"runtime": 60}}
    (work / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    second = run_snakemake(work, *PROFILE_ARGS, env=env, timeout=600)
    # The workloads of l4 could not start: an error at the end of the run, with its cause...
    assert second.returncode != 0
    assert "gpu-cache: ERROR: GPU type l4: no workload run" in second.stderr
    missing = "alphafold3: error: found no run_alphafold.py (looked at /app/alphafold/run_alphafold.py"
    assert missing in second.stderr
    summary = second.stdout[second.stdout.index("gpu-cache summary"):]
    assert "l4 on cpu: ERROR" in summary and missing in summary
    verdict = read_json(results / "validate" / "l4.json")
    assert verdict["status"] == "error" and verdict["passed"] is False
    assert missing in verdict["problems"][0]
    assert all(run["error"] for run in verdict["runs"])
    # ... after the host's jobs ran anyway (they only missed a warm cache for l4).
    batches = {p.parent.name: p.stat().st_mtime
               for p in (work / "output" / "predictions").glob("*/completed_fold.txt")}
    assert batches["A+B"] > finished
    # Those jobs used their own folder: the records show it, stats and doctor name it.
    outside = str(work / "output" / ".jax_compilation_cache")
    assert {p["cache_dir_used"] for f, p in predictions(work).items() if f in ("A+B", "B")} == {outside}
    stats = json.loads(run_cli("stats", "--json", "--cache-root", str(root)).stdout)
    (line,) = stats["outside_root"]
    assert line.startswith(f"rule structure_inference used {outside} (outside the cache root {root})")
    assert "drop that flag or point it at $JAX_COMPILATION_CACHE_DIR" in line
    assert f"outside the cache root: {line}" in run_cli("stats", "--cache-root", str(root)).stdout
    doctor = run_cli("doctor", "--json", "--no-fail", "--cache-root", str(root))
    assert json.loads(doctor.stdout)["outside_root"] == [line]
    # Every miss stats counts, doctor --explain accounts for, by rule: those jobs' misses are
    # in their own folder. --json's explain names the latest process's misses key by key (the
    # hook names jax 0.4.30's misses, which that jax itself logs nowhere).
    assert_explained(root)
    (inference,) = explained(root)["structure_inference"]
    assert inference["cause"] == line
    report = json.loads(run_cli("doctor", "--explain", "--json", "--cache-root", str(root)).stdout)
    assert report["explain"] and all(item["causes"] for item in report["explain"]), report

    # The fix: point the flag at gpu-cache's folder; the jobs hit it again.
    flags = {"--fold_backend": "alphafold3", "--jax_compilation_cache_dir": "$JAX_COMPILATION_CACHE_DIR"}
    configure(work, structure_inference_arguments=flags)
    config = yaml.safe_load((work / "config" / "config.yaml").read_text())
    del config["gpu_cache"]["gpu_types"]["l4"]
    (work / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    third = run_snakemake(work, *PROFILE_ARGS, env=env, timeout=600)
    assert third.returncode == 0, third.stderr[-4000:]
    for prediction in predictions(work).values():
        assert prediction["cache_dir_used"] == str(root / "jax")
        assert prediction["cache"]["hits"] == prediction["cache"]["requests"] > 0
    # The finding no longer holds: stats still shows it, with when it was last seen; doctor
    # no longer warns; explain's cause for those old misses says the same.
    stats = json.loads(run_cli("stats", "--json", "--cache-root", str(root)).stdout)
    (stale,) = stats["outside_root"]
    assert stale.startswith(f"rule structure_inference used {outside} (outside the cache root {root})")
    assert "; last seen " in stale and stale.endswith("since used the cache root")
    assert "no longer: its " in stale and "drop that flag" not in stale
    doctor = json.loads(run_cli("doctor", "--json", "--no-fail", "--cache-root", str(root)).stdout)
    assert doctor["outside_root"] == [] and not any(outside in w for w in doctor["warnings"])
    assert_explained(root)
    assert explained(root)["structure_inference"][0]["cause"].split("; last seen")[0] == \
        stale.split("; last seen")[0]


def test_a_second_folder_on_the_same_root_only_validates(container_root, unbound_dir, tmp_path):
    """README: a run in another folder on the same root skips warming while the last verdict
    holds, here with the image's jax 0.4.30 (whose hits the startup hook names from its cache
    reads) and though each folder pulls the image to a file of its own."""
    root = unbound_dir / "cache"
    env = aps_environ(container_root, GPU_CACHE_ROOT=str(root))
    warms = {}
    for name in ("one", "two", "three"):
        if name == "three":  # an entry the validation hit is gone (pruned): warm again
            hit = next(k for r in records(root, "validate_cache") for k in r["jax"]["hit_keys"])
            (root / "jax" / hit).unlink()
        work = aps_copy(tmp_path / name)
        run = run_snakemake(work, *PROFILE_ARGS, env=env, timeout=600)
        assert run.returncode == 0, run.stderr[-4000:]
        results = work / "results" / "gpu-cache"
        warms[name] = {t: read_json(results / "warm" / f"{t}.json") for t in ("3090", "a100")}
        for gpu_type in ("3090", "a100"):
            assert read_json(results / "validate" / f"{gpu_type}.json")["status"] == "passed"
        for prediction in predictions(work).values():
            assert prediction["cache"]["hits"] == prediction["cache"]["requests"] > 0
    assert not any(w["skipped"] for w in warms["one"].values())
    for warm in warms["two"].values():
        assert warm["skipped"].startswith("the last validation of the same workloads")
        assert warm["runs"] == []
    assert warms["two"]["3090"]["software"]["image"] != warms["one"]["3090"]["software"]["image"]
    assert warms["two"]["3090"]["fingerprint"] == warms["one"]["3090"]["fingerprint"]
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
    """The look-alike through SLURM (its own profile, like AlphaPulldownSnakemake's): two GPU
    types named as SLURM names them, h100, which the partition has, and h200, which it lacks.
    Neither says optional: a type with SLURM resources is optional by default (#25), so h200's
    rejected warm job ends unscheduled at once and the predictions (on any GPU of the
    partition) run after h100's validation."""
    partition = slurm_cluster.partition
    work = aps_copy(tmp_path, slurm_partition=partition)
    config = yaml.safe_load((work / "config" / "config.yaml").read_text())
    image = config["prediction_container"]
    config["gpu_cache"]["gpu_types"] = {
        name: {"container": image, "device": "cpu", "workloads": ["alphafold3"],
               "resources": {"slurm_partition": partition, "gpu": 1, "gpu_model": name, "runtime": 10}}
        for name in ("h100", "h200")}
    (work / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    root = unbound_dir / "cache"
    env = aps_environ(container_root, GPU_CACHE_ROOT=str(root), SLURM_CONF=slurm_cluster.env["SLURM_CONF"])
    command = [sys.executable, "-m", "snakemake", "--profile", "config/profiles/slurm", "--config",
               f"gpu_cache_workflow={SNAKEFILE}", "--slurm-init-seconds-before-status-checks", "1",
               "--jobs", "4", "--nocolor"]
    started = time.time()
    process = subprocess.Popen(command, cwd=work, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        log, _ = process.communicate(timeout=SLURM_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        log, _ = process.communicate()
        slurm_cluster.run(["scancel", "--full", "-p", partition], check=False)
        pytest.fail(f"the pipeline stalled ({SLURM_TIMEOUT} s):\n{log[-5000:]}")
    assert process.returncode == 0, log[-5000:]
    results = work / "results" / "gpu-cache"
    assert read_json(results / "validate" / "h100.json")["status"] == "passed"
    h200 = results / "validate" / "h200.json"
    assert read_json(h200)["status"] == "unscheduled"
    assert read_json(results / "warm" / "h200.json")["unscheduled"].startswith(
        "its job did not finish on a h200 node")
    # Unscheduled at once (sbatch rejected it), not after its queue_wait (2 h) and runtime.
    assert h200.stat().st_mtime - started < SLURM_TIMEOUT
    done = sorted((work / "output" / "predictions").glob("*/completed_fold.txt"))
    assert [p.parent.name for p in done] == ["A+B", "B", "C"]
    summary = (results / "summary.txt").read_text()
    assert "h200: UNSCHEDULED (optional type)" in summary and "h100 on cpu: PASSED" in summary
    assert f"in {image}" in summary
    # The predictions ran as SLURM jobs on a GPU of the partition, hitting the warmed cache.
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
