"""`gpu-cache doctor --explain`: each cause it names is produced for real with two JAX runs, and
every miss `gpu-cache stats` counts is accounted for by rule and cause (#25)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import jax_job_env, run_cli, unavailable

pytestmark = pytest.mark.slow  # every test here runs JAX or Snakemake for seconds

# Uses an integer constant, so JAX_ENABLE_X64 changes the program's dtypes.
PROGRAM = "import jax, jax.numpy as jnp; print(jax.jit(lambda x: jnp.sin(x) + jnp.arange(4))(jnp.ones(4)))"


def run_jax(cache_root: Path, jax_dir: Path | None = None, extra_path: str = "", **env: str) -> None:
    """One real JAX process with the stats hook and the persistent cache."""
    environ = jax_job_env(jax_dir or cache_root / "jax", records=cache_root / "records",
                          extra_path=[extra_path], **env)
    done = subprocess.run([sys.executable, "-c", PROGRAM], env=environ, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def explain(cache_root: Path) -> list[dict]:
    """The key-by-key explanations of the latest process that missed."""
    result = run_cli("doctor", "--explain", "--json", "--cache-root", str(cache_root))
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)["explain"]
    assert found, "the second run missed, so there is something to explain"
    return found


def lambda_of(explanations: list[dict]) -> dict:
    return next(e for e in explanations if e["name"] == "jit__lambda")


def test_a_changed_xla_flag_is_named(cache_root):
    run_jax(cache_root)
    run_jax(cache_root, XLA_FLAGS="--xla_cpu_enable_fast_math=false")
    item = lambda_of(explain(cache_root))
    assert item["changed"] == ["XLA flags"]
    assert "XLA_FLAGS changed from None to '--xla_cpu_enable_fast_math=false'" in item["causes"][0]


def test_jax_enable_x64_changes_the_computation(cache_root):
    run_jax(cache_root)
    run_jax(cache_root, JAX_ENABLE_X64="1")
    item = lambda_of(explain(cache_root))
    assert item["changed"] == ["computation"]
    assert "JAX_ENABLE_X64 changed" in item["causes"][0]


def test_the_cache_path_in_the_key_with_xla_caches_on(cache_root):
    # jax 0.10.x puts the XLA cache folders (inside the cache dir) into the compile options.
    run_jax(cache_root, jax_dir=cache_root / "one", JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES="all")
    run_jax(cache_root, jax_dir=cache_root / "two", JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES="all")
    item = lambda_of(explain(cache_root))
    assert item["changed"] == ["compile_options"]
    assert "cache folder's path is in the key" in item["causes"][0]
    assert str(cache_root / "one") in item["causes"][0] and str(cache_root / "two") in item["causes"][0]


def test_the_cache_path_is_not_in_the_key_with_xla_caches_none(cache_root):
    run_jax(cache_root, jax_dir=cache_root / "one", JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES="none")
    run_jax(cache_root, jax_dir=cache_root / "two", JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES="none")
    item = lambda_of(explain(cache_root))
    assert item["changed"] == [] and item["compared_with"]["key"] == item["key"]
    assert "same key was computed before" in item["causes"][0]


@pytest.fixture(scope="session")
def zstandard_path(tmp_path_factory) -> str:
    """A folder that makes zstandard importable: "" when it is installed already, else a
    pip --target install (the `test` extra installs it, so CI needs no network here)."""
    if importlib.util.find_spec("zstandard") is not None:
        return ""
    target = tmp_path_factory.mktemp("zstd")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target",
                           str(target), "zstandard"], capture_output=True, text=True)
    if done.returncode != 0:
        unavailable(f"zstandard is not installed and cannot be: {done.stderr[-300:]}")
    return str(target)


def test_zstandard_in_one_environment_only(cache_root, tmp_path, zstandard_path):
    run_jax(cache_root, extra_path=zstandard_path)
    # The other environment lacks a working zstandard: its import fails, as when not installed.
    blocked = tmp_path / "no-zstd" / "zstandard"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('zstandard is not installed here')\n")
    run_jax(cache_root, extra_path=str(blocked.parent))
    item = lambda_of(explain(cache_root))
    assert item["changed"] == ["compression"]
    assert "compression changed from zstandard to zlib" in item["causes"][0]


def test_a_computation_never_seen_before_is_a_first_compile(cache_root):
    run_jax(cache_root)
    item = lambda_of(explain(cache_root))
    assert item["compared_with"] is None and "no earlier run computed jit__lambda" in item["causes"][0]


# --- explain accounts for every miss stats counts (#25) -------------------------------------


def by_rule(cache_root: Path) -> tuple[dict[str, int], dict[str, list[dict]]]:
    """stats' JAX misses per rule, and explain's causes per rule."""
    stats = json.loads(run_cli("stats", "--json", "--cache-root", str(cache_root)).stdout)
    counted = {rule: u["jax_misses"] for rule, u in stats["usage"]["by_rule"].items() if u["jax_misses"]}
    report = json.loads(run_cli("doctor", "--explain", "--json", "--cache-root", str(cache_root)).stdout)
    causes = {g["rule"]: g["causes"] for g in report["by_rule"] if g["kind"] == "jax"}
    return counted, causes


def assert_agree(counted: dict[str, int], causes: dict[str, list[dict]]) -> None:
    assert set(counted) == set(causes)
    for rule, misses in counted.items():
        assert sum(c["misses"] for c in causes[rule]) == misses, (rule, causes[rule])


def test_every_miss_stats_counts_is_explained_by_rule(cache_root):
    run_jax(cache_root, GPU_CACHE_RULE="warm_cache")
    run_jax(cache_root, GPU_CACHE_RULE="predict", XLA_FLAGS="--xla_cpu_enable_fast_math=false")
    counted, causes = by_rule(cache_root)
    assert counted["warm_cache"] > 0 and counted["predict"] > 0
    assert_agree(counted, causes)
    (warm,) = causes["warm_cache"]
    assert warm["cause"].startswith("the warm pass compiles what the cache lacks")
    (predict,) = causes["predict"]
    item = lambda_of(predict["keys"])
    assert item["changed"] == ["XLA flags"] and "XLA_FLAGS changed" in item["causes"][0]
    text = run_cli("doctor", "--explain", "--cache-root", str(cache_root)).stdout
    assert f"predict: {counted['predict']} jax misses in 1 process" in text
    assert "jit__lambda: changed key parts: XLA flags" in text


def write_record(cache_root: Path, name: str, when: float, **fields) -> None:
    (cache_root / "records").mkdir(parents=True, exist_ok=True)
    record = {"time": when, "rule": None, "gpu_type": None, "env": {}, "device": {}} | fields
    (cache_root / "records" / f"{name}.json").write_text(json.dumps(record))


PARTS = {"computation": "c1", "jax_lib version": "j1", "XLA flags": "x1", "compile_options": "o1",
         "accelerator_config": "a1", "compression": "z1"}


def test_misses_of_a_jax_that_names_none_are_inferred_from_the_keys_it_computed(cache_root):
    """A jax whose misses the hook cannot name (one that logs none and whose cache reads it
    does not know; jax 0.4.30 logs none, but the hook names them from its cache reads): its
    records count misses and hold every key's parts, but name no miss. Records written here
    as the hook writes them then. --json's explain infers them too, key by key."""
    soft = {"python": "3.9.2", "jax": "0.4.30"}
    write_record(cache_root, "warm", 100.0, rule="warm_cache", gpu_type="h100", software=soft,
                 jax={"hits": 0, "misses": 2, "missed": [],
                      "key_parts": {"jit_f-aaa": PARTS, "jit_g-bbb": PARTS | {"computation": "g"}}})
    # The job computed jit_g as the warm did (a hit) and jit_f with other XLA flags (a miss).
    write_record(cache_root, "job", 200.0, rule="structure_inference", software=soft,
                 jax={"hits": 1, "misses": 1, "missed": [],
                      "key_parts": {"jit_f-ccc": PARTS | {"XLA flags": "x2"},
                                    "jit_g-bbb": PARTS | {"computation": "g"}}})
    counted, causes = by_rule(cache_root)
    assert counted == {"warm_cache": 2, "structure_inference": 1}
    assert_agree(counted, causes)
    (job,) = causes["structure_inference"]
    assert job["cause"].startswith("jax 0.4.30 does not name the computations that missed")
    (item,) = job["keys"]
    assert item["name"] == "jit_f" and item["changed"] == ["XLA flags"]
    report = json.loads(run_cli("doctor", "--explain", "--json", "--cache-root", str(cache_root)).stdout)
    assert report["explain"] == [{"kind": "jax", **item}]  # its top-level list mixes kinds


def test_a_folder_outside_the_root_and_other_software_are_the_causes_stats_names(cache_root, tmp_path):
    soft_warm, soft_job = {"python": "3.12.1", "jax": "0.9.1"}, {"python": "3.11.7", "jax": "0.10.2"}
    write_record(cache_root, "warm", 100.0, rule="warm_cache", gpu_type="h100", software=soft_warm,
                 jax={"hits": 0, "misses": 3, "cache_dir": str(cache_root / "jax")})
    mine = str(tmp_path / "own")
    write_record(cache_root, "own", 200.0, rule="structure_inference", software=soft_warm,
                 jax={"hits": 0, "misses": 5, "cache_dir": mine})
    write_record(cache_root, "other", 300.0, rule="analyse", software=soft_job,
                 jax={"hits": 0, "misses": 4, "cache_dir": str(cache_root / "jax")})
    counted, causes = by_rule(cache_root)
    assert counted == {"warm_cache": 3, "structure_inference": 5, "analyse": 4}
    assert_agree(counted, causes)
    stats = json.loads(run_cli("stats", "--json", "--cache-root", str(cache_root)).stdout)
    (outside,) = stats["outside_root"]
    (mismatch,) = stats["software_mismatches"]
    assert [c["cause"] for c in causes["structure_inference"]] == [outside]
    assert [c["cause"] for c in causes["analyse"]] == [mismatch]
    assert "no longer" not in outside + mismatch


def test_a_finding_that_no_longer_holds_says_when_it_was_last_seen(cache_root, tmp_path):
    soft = {"python": "3.12.1", "jax": "0.9.1"}
    write_record(cache_root, "warm", 100.0, rule="warm_cache", gpu_type="h100", software=soft,
                 jax={"hits": 0, "misses": 3, "cache_dir": str(cache_root / "jax")})
    write_record(cache_root, "own", 200.0, rule="structure_inference", software=soft,
                 jax={"hits": 0, "misses": 5, "cache_dir": str(tmp_path / "own")})
    # The flag was fixed: the rule's later processes use the cache root.
    write_record(cache_root, "fixed", 300.0, rule="structure_inference", software=soft,
                 jax={"hits": 3, "misses": 0, "cache_dir": str(cache_root / "jax")})
    stats = json.loads(run_cli("stats", "--json", "--cache-root", str(cache_root)).stdout)
    (line,) = stats["outside_root"]
    assert "; last seen " in line and " ago (19" in line
    assert line.endswith("no longer: its 1 process since used the cache root")
    doctor = json.loads(run_cli("doctor", "--json", "--no-fail", "--cache-root", str(cache_root)).stdout)
    assert doctor["outside_root"] == [] and not any("outside the cache root" in w for w in doctor["warnings"])
    counted, causes = by_rule(cache_root)
    assert_agree(counted, causes)
    assert causes["structure_inference"][0]["cause"] == line
