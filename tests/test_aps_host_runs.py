"""gpu-cache as a module of the AlphaPulldownSnakemake look-alike (tests/aps_host, deployed as
harness/aps_deploy.py says), run for real: plain Snakemake builds the host's target with
gpu-cache's warm and validation in front (structure inference in a `container:` rule through
tests/bin/apptainer, the stand-in over bwrap: Python 3.9 and jax 0.4.30), batches that pass their
own cache flag, a second folder on the same root that only validates, and the README's command
through SLURM. The plans (dry runs) are in test_aps_host.py."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from aps_deploy import (
    IMAGE_AF3,
    aps_copy,
    aps_environ,
    predictions,
    profile,
    readme_blocks,
    records,
    write_yaml,
)
from gpu_cache.config.memory import run_memory_mb
from helpers import read_json, run_cli, run_snakemake

#: Longest a run of the look-alike through SLURM may take.
SLURM_TIMEOUT = 600


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
    outside = own_flags_and_a_type_without_jax(work, root, env, finished)
    the_readmes_settings_again(work, root, env, outside)


def own_flags_and_a_type_without_jax(work: Path, root: Path, env: dict[str, str], finished: float) -> str:
    """The second run of the test above, on its folder and root: batches that pass their own
    cache flag, and a type whose warm cannot run. The folder those batches used."""
    results = work / "results" / "gpu-cache"
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
    return outside


def the_readmes_settings_again(work: Path, root: Path, env: dict[str, str], outside: str) -> None:
    """The third run of the test above: after the run whose batches used their own folder
    (``outside``), the README's settings again."""
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
