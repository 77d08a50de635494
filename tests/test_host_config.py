"""What an AlphaPulldownSnakemake user meets in gpu-cache's config (#30, #41): the CLI reads a
host pipeline's config with the file of gpu-cache's settings for it, merged as Snakemake merges
--configfile files (its gpu_cache: block, or the block --config-key names), whose {host: KEY}
values are the host's own; GPU names that YAML reads as numbers are taken as the text they are,
a host's list of partitions is taken as SLURM takes it, doctor's hint for a GRES type no GPU
type asks for works when pasted, the alphafold3 workload finds run_alphafold.py where images
keep it, and a verdict names the image as the config does. Fast: the config loader and the
CLI's argument handling, in process or one CLI call each."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import yaml

from gpu_cache.commands.validate import judge_phases
from gpu_cache.config import host_join
from gpu_cache.config.cluster import gres_by_partition, parse
from gpu_cache.config.host import load_config_files, workflow_config
from gpu_cache.config.settings import settings_from
from gpu_cache.config.targets import gpu_types, gres_mapping
from gpu_cache.core.errors import UsageError
from gpu_cache.core.reports import PhaseResult, RunResult
from gpu_cache.jobenv import env
from gpu_cache.workloads import alphafold3
from helpers import REPO, SNAKEFILE, clean_environ, run_cli, run_snakemake

#: The look-alike's config (AlphaPulldownSnakemake's keys) and the file of gpu-cache's settings.
HOST_CONFIG = REPO / "tests" / "aps_host" / "config" / "config.yaml"
SETTINGS = REPO / "tests" / "aps_host" / "config" / "gpu-cache.yaml"


def test_a_hosts_config_and_gpu_caches_file_are_read_as_snakemake_merges_them():
    config = load_config_files([HOST_CONFIG, SETTINGS])
    types = gpu_types(settings_from(config))
    assert sorted(types) == ["3090", "a100"]
    # The host's values, by reference: its partition, image and weights (a key it spells
    # `backend_weights_directory :`).
    assert types["3090"].resources["slurm_partition"] == "gpu-el8"
    assert types["a100"].container == "docker://kosinskilab/alphafold3:2.6.2"
    assert config["workloads"]["alphafold3"]["model_dir"] == "/g/kosinski/dima/alphafold3_weights/"
    assert config["host_rules"] == ["structure_inference"]


def test_a_hosts_value_is_read_where_it_is_at_the_end():
    """The workflow's view (a module given the host's whole config): a value the host sets
    anywhere (a later --configfile, --config) is the one gpu-cache takes."""
    host = yaml.safe_load(HOST_CONFIG.read_text()) | yaml.safe_load(SETTINGS.read_text())
    host["slurm_partition"] = ["gpu-el8", "gpu-training"]
    a100 = settings_from(workflow_config(host)).gpu_types["a100"]
    assert a100.resources["slurm_partition"] == "gpu-el8,gpu-training"


@pytest.mark.parametrize("config, message", [
    ({"gpu_cache": {"gpu_types": {"a100": {"container": {"host": "prediction_containr"}}}},
      "prediction_container": "docker://x/y"},
     "config key gpu_cache.gpu_types.a100.container: {host: prediction_containr}: the host's config has "
     "no key prediction_containr; did you mean prediction_container?"),
    ({"gpu_types": {"a100": {"container": {"host": "prediction_container"}}}},
     "config key gpu_types.a100.container: {host: prediction_container} names a key of a host "
     "pipeline's config, and there is none here"),
])
def test_a_wrong_reference_is_one_line_naming_the_key(config, message):
    with pytest.raises(UsageError) as error:
        workflow_config(config)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


#: The older README's mapping, pasted after the host's own.
PASTED = "structure_inference_arguments:\n  --jax_compilation_cache_dir: {}\n"


@pytest.mark.parametrize("host, second, lost", [
    ("  --fold_backend: alphafold3\n", PASTED.format("$JAX_COMPILATION_CACHE_DIR"), "--fold_backend"),
    ("  --fold_backend: alphafold3\n  --a: 1\n  --b: 2\n  --c: 3\n",
     PASTED.format("${JAX_COMPILATION_CACHE_DIR}"), "--fold_backend, --a, --b and more"),
    ("  --fold_backend: alphafold3\n  --a: 1\n  --b: 2\n", PASTED.format("$JAX_COMPILATION_CACHE_DIR"),
     "--fold_backend, --a, --b"),
    # given three times: what the last drops of both before it
    ("  --fold_backend: alphafold3\nstructure_inference_arguments:\n  --a: 1\n",
     PASTED.format("$JAX_COMPILATION_CACHE_DIR"), "--fold_backend, --a"),
    ("  --fold_backend: alphafold3\n", PASTED.format("/scratch/own"), None),  # not gpu-cache's block
    ("  --jax_compilation_cache_dir: x\n", PASTED.format("$JAX_COMPILATION_CACHE_DIR"), None),  # drops none
])
def test_a_pasted_mapping_that_drops_the_hosts_keys_is_named_with_them(host, second, lost, tmp_path):
    path = tmp_path / "config.yaml"
    # (another mapping given twice before it, without the flag, is not the pasted block)
    path.write_text(f"batch_size: 1\nother: {{x: 1}}\nother: {{y: 1}}\nstructure_inference_arguments:\n"
                    f"{host}\n{second}")
    line = host_join.dropped_arguments(str(path))
    if lost is None:
        assert line is None
        return
    assert line == (f"{path} gives structure_inference_arguments twice, the second from an older README of "
                    f"gpu-cache, which replaces the first: every job would lose {lost}. Delete the pasted "
                    "block; gpu-cache's settings go in a file of their own, passed with --configfile "
                    "(config/gpu-cache.yaml, README)")
    assert yaml.safe_load(path.read_text())["structure_inference_arguments"] == {
        "--jax_compilation_cache_dir": second.split(": ")[-1].strip()}  # as Snakemake reads it


def test_a_pasted_mapping_in_a_file_that_is_no_yaml_mapping_is_not_named(tmp_path):
    for text in ("- a\n- b\n", "a: [\n", "\xff\n", "", "a: " + "[" * 3000 + "]" * 3000 + "\n"):
        path = tmp_path / "config.yaml"
        path.write_bytes(text.encode("latin-1"))
        assert host_join.dropped_arguments(str(path)) is None
    assert host_join.dropped_arguments(str(tmp_path / "none.yaml")) is None


MISSPELT = ("config key gpu_cache.host_rule: not a key of gpu-cache's config; did you mean host_rules? "
            "(config/README.md explains each)")


def test_a_misspelt_key_in_the_block_is_named_by_its_whole_path(tmp_path):
    """A typo in the gpu_cache: block was named without its gpu_cache. prefix; so were a size
    or an age that does not parse."""
    path = tmp_path / "config.yaml"
    path.write_text("prediction_container: x\ngpu_cache: {host_rule: [structure_inference]}\n")
    done = run_cli("doctor", "--config", str(path), "--cache-root", str(tmp_path / "c"))
    assert done.stderr == f"gpu-cache: error: config file {path}: {MISSPELT}\n"
    with pytest.raises(UsageError, match=r"^config key gpu_cache.prune.max_age: age '3 weeks' is not"):
        settings_from(workflow_config({"gpu_cache": {"prune": {"max_age": "3 weeks"}}}), where="gpu_cache")


@pytest.mark.slow
def test_a_misspelt_key_in_the_block_is_named_by_its_whole_path_in_the_workflow(tmp_path):
    work = tmp_path / "work"
    (work / "config").mkdir(parents=True)
    (work / "config" / "config.yaml").write_text("prediction_container: x\n"
                                                 "gpu_cache: {host_rule: [structure_inference]}\n")
    done = run_snakemake(work, "-s", SNAKEFILE, "-n",
                         env=clean_environ(GPU_CACHE_ROOT=str(tmp_path / "c")))
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [f"gpu-cache: config: {MISSPELT}"], done.stderr


def test_another_key_is_named_with_config_key(tmp_path):
    host = yaml.safe_load(HOST_CONFIG.read_text())
    host["caches"] = yaml.safe_load(SETTINGS.read_text())["gpu_cache"]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(host))
    assert sorted(load_config_files([path], "caches")["gpu_types"]) == ["3090", "a100"]
    with pytest.raises(UsageError, match=r"has no gpu_cache: block .*--config-key names the key"):
        load_config_files([path], "gpu_cache")
    # Without the option and without a gpu_cache block, the file is gpu-cache's own config:
    # the host's keys are unknown there, and the message names the first.
    with pytest.raises(UsageError, match=r"config file .*: config key \S+: not a key of gpu-cache's "
                                         r"config.*holds gpu-cache's under gpu_cache:"):
        load_config_files([path])


def test_doctor_takes_the_hosts_config_and_gpu_caches_file(tmp_path):
    shutil.copy(HOST_CONFIG, tmp_path / "config.yaml")
    shutil.copy(SETTINGS, tmp_path / "gpu-cache.yaml")
    files = ("--config", str(tmp_path / "config.yaml"), "--config", str(tmp_path / "gpu-cache.yaml"))
    done = run_cli("doctor", "--json", "--no-fail", *files, "--cache-root", str(tmp_path / "cache"))
    assert done.returncode == 0, done.stderr
    bad = run_cli("doctor", *files, "--config-key", "nope", "--cache-root", str(tmp_path / "cache"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "has no nope: block" in bad.stderr
    alone = run_cli("doctor", "--config-key", "gpu_cache")
    assert alone.returncode == 2 and "--config-key needs --config" in alone.stderr


def test_doctor_says_when_the_hosts_snakefile_lacks_the_module_block(tmp_path):
    """gpu-cache's settings passed without the block at the end of the host's Snakefile change no
    job: doctor, given the host's config files, says so in one line (and not with the block)."""
    host = tmp_path / "aps"  # as snakedeploy deploys the pipeline, with the README's block at the end
    shutil.copytree(REPO / "tests" / "aps_host" / "config", host / "config")
    readme = (REPO / "README.md").read_text().split("## Use it inside a pipeline", 1)[1]
    (block,) = re.findall(r"```python\n(.*?)```", readme, re.DOTALL)
    (host / "workflow").mkdir()
    pipeline = 'github("KosinskiLab/AlphaPulldownSnakemake", path="workflow/Snakefile", tag="2.6.2")'
    generated = ('configfile: "config/config.yaml"\n\n\nmodule AlphaPulldownSnakemake:\n    snakefile:\n'
                 f"        {pipeline}\n    config:\n        config\n\n\n"
                 "use rule * from AlphaPulldownSnakemake\n")
    (host / "workflow" / "Snakefile").write_text(generated + "\n\n" + block)
    files = ("--config", str(host / "config" / "config.yaml"),
             "--config", str(host / "config" / "gpu-cache.yaml"))

    def unjoined() -> list[str]:
        done = run_cli("doctor", "--json", "--no-fail", *files, "--cache-root", str(tmp_path / "cache"))
        assert done.returncode == 0, done.stderr
        return [w for w in json.loads(done.stdout)["warnings"] if "does not include gpu-cache's module" in w]

    assert unjoined() == []
    snakefile = host / "workflow" / "Snakefile"
    text = snakefile.read_text()
    snakefile.write_text(text[:text.index("# --- gpu-cache")])
    (line,) = unjoined()
    assert line.startswith(f"{snakefile} does not include gpu-cache's module (the block at its end, README")
    assert line.endswith("with gpu-cache's settings alone, the pipeline runs as before, uncached")


#: A host's config and a file of settings given after it (#46): the later file's value wins,
#: key by key inside nested mappings, and a {host: KEY} inside a list is the host's value.
HOST_WITH_A_LIST = """\
small_bucket: 64
gpu_cache:
  cache_root: {first}
  default_workloads: [odd]
  workloads: {{odd: {{command: "true {{shape}}", shapes: [{{host: small_bucket}}, 256]}}}}
"""
LATER_SETTINGS = """\
small_bucket: 128
gpu_cache: {{cache_root: {second}}}
"""


def test_the_later_config_file_wins_and_a_reference_inside_a_list_resolves(tmp_path):
    """What ``warm`` announces before it runs (the workload's shapes, the cache root), with
    the files in one order and then the other."""
    host, later = tmp_path / "config.yaml", tmp_path / "gpu-cache.yaml"
    first, second = tmp_path / "first root", tmp_path / "second root"
    host.write_text(HOST_WITH_A_LIST.format(first=json.dumps(str(first))))
    later.write_text(LATER_SETTINGS.format(second=json.dumps(str(second))))
    for files, shape, root in (((host, later), 128, second), ((later, host), 64, first)):
        done = run_cli("warm", *(arg for path in files for arg in ("--config", str(path))),
                       "--output", str(tmp_path / "warm.json"))
        assert done.returncode == 0, done.stderr
        announced = done.stderr.splitlines()[0]
        assert announced.startswith(f"gpu-cache warm: GPU type cpu: odd at shapes {shape}, 256; "), announced
        assert announced.endswith(f"; cache root {root}"), announced


def test_gres_names_yaml_reads_as_numbers_are_their_text():
    config = yaml.safe_load("gpu_types: {3090: {device: rtx3090, resources: {gpu: 1, gpu_model: 3090}}}")
    types = gpu_types(settings_from(config))
    assert list(types) == ["3090"] and types["3090"].resources["gpu_model"] == "3090"


def test_a_hosts_list_of_partitions_is_one_comma_separated_partition_resource():
    config = yaml.safe_load("""
        slurm_partition: &slurm_partition [gpu-el8, gpu-training]
        gpu_cache:
          gpu_types: {h200: {resources: {slurm_partition: *slurm_partition, gpu: 1, gpu_model: h200}}}
        """)
    types = gpu_types(settings_from(config["gpu_cache"]))
    assert types["h200"].resources["slurm_partition"] == "gpu-el8,gpu-training"


def test_doctors_hint_for_an_unasked_gres_type_works_when_pasted():
    offers = tuple(parse("gpu-el8*|96000|32|gpu:3090:4(S:0-1)|(null)|infinite\n"))
    (line,) = gres_mapping({}, gres_by_partition(offers))
    hint = re.search(r"to warm it: (gpu_types: .*)\)$", line).group(1)
    pasted = yaml.safe_load(hint.replace("<the name `gpu-cache doctor` prints on such a node>", "rtx3090"))
    spec = gpu_types(settings_from(pasted))["3090"]
    assert spec.resources == {"slurm_partition": "gpu-el8", "gpu": 1, "gpu_model": "3090"}
    assert spec.expected_device == "rtx3090"


@pytest.mark.parametrize("present, found", [
    (["app/AlphaPulldown/alphafold3/run_alphafold.py"], "app/AlphaPulldown/alphafold3/run_alphafold.py"),
    (["AlphaPulldown/alphafold3/run_alphafold.py"], "AlphaPulldown/alphafold3/run_alphafold.py"),
    (["app/alphafold/run_alphafold.py", "app/AlphaPulldown/alphafold3/run_alphafold.py"],
     "app/alphafold/run_alphafold.py"),
    (["opt/af3/src/run_alphafold.py", "opt/zz/run_alphafold.py"], "opt/zz/run_alphafold.py"),
    (["opt/a/b/c/run_alphafold.py"], None),  # deeper than two folders: not searched
    ([], None),
])
def test_run_alphafold_is_found_where_images_keep_it(tmp_path, present, found):
    for name in present:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert alphafold3.find_script(str(tmp_path)) == (str(tmp_path / found) if found else None)


def test_a_workload_without_script_says_where_it_looked(tmp_path, capsys):
    (tmp_path / "weights").mkdir()
    with pytest.raises(SystemExit) as stop:
        alphafold3.main(["--shape", "16", "--buckets", "16", "--model-dir", str(tmp_path / "weights")])
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "found no run_alphafold.py (looked at /app/alphafold/run_alphafold.py, " \
           "/app/AlphaPulldown/alphafold3/run_alphafold.py" in line and "set the workload's script:" in line



def test_a_verdicts_problems_name_the_image_as_the_config_does(tmp_path):
    """A type whose workloads could not start in its image: the verdict's problem line names
    the image as the config (and the summary) do, not the file Snakemake pulled it to."""
    image = "docker://kosinskilab/alphafold3:2.6.2"
    pulled = str(tmp_path / ".snakemake" / "singularity" / "2a6b4010ee62cfd996fc337661297be8.simg")
    settings = settings_from({"gpu_types": {"3090": {"container": image, "device": "cpu"}},
                              "cache_root": str(tmp_path / "cache")})
    phase = PhaseResult("validate", "3090", "run", device={"name": "cpu", "gpu_type": "cpu", "count": 0},
                        runs=[RunResult("alphafold3", 128, 0.1, 2, "alphafold3: error: no script")],
                        software={"python": "3.12.3", "jax": "0.9.1", "image": pulled})
    verdict = judge_phases(settings, "3090", {"cold": None, "validate": phase}, env.resolve(settings))
    assert verdict.outcome == "error"
    assert f"They ran with jax 0.9.1 (Python 3.12.3) in {image}:" in verdict.problems[0]
    assert pulled not in " ".join(verdict.problems)
    assert verdict.software["image"] == pulled and verdict.software["container"] == image
