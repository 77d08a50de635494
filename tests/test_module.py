"""gpu-cache as a Snakemake module inside a host pipeline (tests/example_host), run locally."""

import pytest

from helpers import MODULE, SNAKEFILE, clean_environ, host_copy, read_json, run_snakemake

pytestmark = pytest.mark.slow  # every test here runs JAX or Snakemake for seconds


@pytest.mark.parametrize("prefix", [None, "cache-work"])
def test_host_pipeline_waits_for_validation_and_prunes_last(tmp_path, prefix):
    work = host_copy(tmp_path)
    args = ["--cores", "2", "--config", MODULE] + ([f"gpu_cache_prefix={prefix}"] if prefix else [])
    env = clean_environ(GPU_CACHE_ROOT=str(tmp_path / "cache"))
    result = run_snakemake(work, *args, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    results = work / (prefix or ".") / "results" / "gpu-cache"
    for gpu_type in ("h100", "a100"):
        verdict = read_json(results / "validate" / f"{gpu_type}.json")
        assert verdict["passed"] is True, verdict["problems"]
    predictions = sorted((work / "predictions").glob("*.json"))
    assert len(predictions) == 4
    validations = [results / "validate" / f"{t}.json" for t in ("h100", "a100")]
    for path in predictions:
        prediction = read_json(path)
        # Host jobs got the cache environment and were served by the warmed cache.
        assert prediction["environment"]["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "cache" / "jax")
        assert prediction["cache"]["requests"] > 0
        assert prediction["cache"]["hits"] == prediction["cache"]["requests"]
        assert path.stat().st_mtime >= min(v.stat().st_mtime for v in validations)
    prune = results / "prune.json"
    assert prune.stat().st_mtime >= max(p.stat().st_mtime for p in predictions)
    assert (results / "summary.txt").exists()


def test_a_validation_on_the_wrong_device_fails_and_says_so(tmp_path):
    work = host_copy(tmp_path)
    config = (work / "config" / "config.yaml").read_text()
    h100 = "    h100:\n      workloads: [predict]\n      device: "
    config = config.replace(h100 + "cpu", h100 + "h100")
    assert "device: h100" in config
    (work / "config" / "config.yaml").write_text(config)
    env = clean_environ(GPU_CACHE_ROOT=str(tmp_path / "cache"))
    result = run_snakemake(work, "--cores", "2", "--config", MODULE, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    verdict = read_json(work / "results" / "gpu-cache" / "validate" / "h100.json")
    assert verdict["passed"] is False
    assert any("GPU type h100 expects device h100, but the job saw cpu" in p for p in verdict["problems"])


HOST_RULE_KINDS = """
module gpu_cache:
    snakefile: {snakefile!r}
    config: {{"cache_root": {cache!r}}}

use rule * from gpu_cache as gpu_cache_*

rule all:
    input: "shell.txt", "script.txt", "run.txt"
    default_target: True

rule by_shell:
    output: "shell.txt"
    shell: "echo $JAX_COMPILATION_CACHE_DIR > {{output}}"

rule by_script:
    output: "script.txt"
    script: "dump.py"

rule by_run:
    output: "run.txt"
    run:
        import os
        with open(output[0], "w") as stream:
            stream.write(os.environ["JAX_COMPILATION_CACHE_DIR"] + "\\n")
"""


def test_every_kind_of_host_rule_gets_the_cache_environment(tmp_path):
    """shell, script and run rules of a host that uses no gpu-cache profile."""
    work = tmp_path / "host"
    work.mkdir()
    cache = tmp_path / "cache"
    (work / "Snakefile").write_text(HOST_RULE_KINDS.format(
        snakefile=SNAKEFILE, cache=str(cache)))
    (work / "dump.py").write_text(
        "import os\nopen(snakemake.output[0], 'w').write(os.environ['JAX_COMPILATION_CACHE_DIR'] + '\\n')\n")
    result = run_snakemake(work, "--cores", "1", env=clean_environ())
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ("shell", "script", "run"):
        assert (work / f"{name}.txt").read_text().strip() == str(cache / "jax"), name
