"""Hostile or broken input that is not a cache entry: configs, records, reports, sizes, the
profile's path. Each is one clear line and the documented exit code, never a traceback, and
records are bounded like a cache."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO, SCRIPTS, clean_environ, run_cli, run_snakemake
from release import build, fresh_venv, install

#: 365 bytes of YAML whose aliases expand to 9^9 (387 million) strings.
ALIAS_BOMB = "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 9) if prev else ', '.join(['lol'] * 9)}]\n"
    for prev, name in zip([None, *"abcdefgh"], "abcdefghi", strict=True))


def one_line_error(result: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-cache: error:"), lines
    return lines[0]


@pytest.mark.parametrize("content,message", [
    (b"cache_root: \"\xff\xfe\"\n", "not UTF-8"),
    (ALIAS_BOMB.encode(), "expands to more than 1048576 values"),
    (b"[1, 2]\n", "must hold a mapping"),
    (b"prune: {max_size: " + b"9" * 400 + b"G}\n", "prune.max_size"),
])
def test_a_bad_config_file_is_one_line_exit_2_and_quick(content, message, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_bytes(content)
    started = time.monotonic()
    result = run_cli("env", "--config", str(config), "--cache-root", str(tmp_path / "cache"))
    assert time.monotonic() - started < 20  # the alias bomb took 28 s, then MemoryError
    assert message in one_line_error(result)


@pytest.mark.parametrize("content,where", [
    ("cache_root: /x\nprune\n", "line 3, column 1: could not find expected ':' (while scanning a simple"),
    ("prune: {max_size: 1G\n", "line 2, column 1: expected ',' or '}', but got '<stream end>'"),
    ("prune:\n\tmax_size: 1G\n", "line 2, column 1: found character '\\t' that cannot start any token"),
    ("cache_root: \"x\x01\"\n", "line 1, column 15: unacceptable character #x0001"),
    ("cache_root: *root\n", "line 1, column 13: found undefined alias 'root'"),
])
def test_invalid_yaml_is_one_line_with_file_line_and_column(content, where, tmp_path):
    """The parser's own message takes 4-5 lines with a copy of the line; ours takes one."""
    config = tmp_path / "config.yaml"
    config.write_text(content)
    line = one_line_error(run_cli("env", "--config", str(config), "--cache-root", str(tmp_path / "cache")))
    assert line.startswith(f"gpu-cache: error: config file {config} is not valid YAML: {where}"), line


@pytest.mark.parametrize("command", [["env"], ["env", "--json"], ["stats"], ["doctor"],
                                     ["prune", "--dry-run"], ["warm"]])
def test_a_config_that_is_a_fifo_or_a_folder_is_refused_at_once(command, tmp_path):
    """Opening a FIFO to read blocks until someone writes it: each reader of --config checks
    first and opens without blocking. A link to a real config is followed."""
    fifo = tmp_path / "config.fifo"
    os.mkfifo(fifo)
    cache = str(tmp_path / "cache")
    started = time.monotonic()
    for bad, what in ((fifo, "a FIFO"), (tmp_path, "a folder")):
        line = one_line_error(run_cli(*command, "--config", str(bad), "--cache-root", cache, timeout=60))
        assert line == f"gpu-cache: error: config file {bad} is {what}, not a regular file"
    assert time.monotonic() - started < 30
    real = tmp_path / "real.yaml"
    real.write_text("default_workloads: []\nmin_free_space: 1K\n")
    (tmp_path / "link.yaml").symlink_to(real)
    if command[0] == "env":
        result = run_cli(*command, "--config", str(tmp_path / "link.yaml"), "--cache-root", cache, timeout=60)
        assert result.returncode == 0 and not result.stderr, result.stderr


@pytest.mark.parametrize("args,message", [
    (["--config-json", "[1]"], "must be a JSON object"),
    (["--config-json", '"text"'], "must be a JSON object"),
])
def test_a_config_that_is_not_a_mapping_is_one_line(args, message, tmp_path):
    result = run_cli("env", *args, "--cache-root", str(tmp_path))
    assert message in one_line_error(result)


@pytest.mark.parametrize("flag", ["--max-size", "--max-age"])
def test_a_400_digit_limit_names_its_own_flag(flag, tmp_path):
    line = one_line_error(run_cli("prune", flag, "9" * 400, "--cache-root", str(tmp_path)))
    assert flag in line and ("--max-age" if flag == "--max-size" else "--max-size") not in line


@pytest.mark.parametrize("content", ["{}", "[]", '"x"', "null", '{"gpu_type": "cpu", "passed": "yes", '
                                     '"warm_seconds": "fast"}'])
@pytest.mark.parametrize("command", ["summary", "plots"])
def test_summary_and_plots_of_a_file_that_is_no_report(command, content, tmp_path):
    report = tmp_path / "cpu.json"
    report.write_text(content)
    extra = ["--outdir", str(tmp_path / "plots"), "--cache-root", str(tmp_path / "c")] \
        if command == "plots" else []
    line = one_line_error(run_cli(command, "--validate", str(report), *extra))
    assert str(report) in line and "validation verdict" in line


def write_record(folder: Path, name: str, record: object, age_days: float = 0.0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(record if isinstance(record, str) else json.dumps(record))
    when = time.time() - age_days * 86400
    os.utime(path, (when, when))
    return path


#: Field values a record may hold that are not what the hook writes; 1e999 parses as inf.
ODD_VALUES = ['NaN', '"many"', 'null', '1e999', '-1e999', '[1]', '{"a": 1}', 'true']


@pytest.mark.slow
def test_records_with_odd_values_are_read_as_absent(tmp_path):
    records = tmp_path / "records"
    for number, value in enumerate(ODD_VALUES):
        text = (f'{{"time": {value}, "rule": {value}, "gpu_type": {value}, "run_id": {value}, '
                f'"jax": {{"hits": {value}, "misses": {value}, "saved_seconds": {value}, '
                f'"missed": {value}, "key_parts": {value}, "key_context": {value}}}, '
                f'"triton": {value}, "env": {value}}}')
        write_record(records, f"{number}.json", text)
    write_record(records, "list.json", "[1, 2, 3]")
    write_record(records, "deep.json", "[" * 100_000 + "]" * 100_000)
    write_record(records, "good.json", {"time": time.time(), "rule": "predict", "gpu_type": "cpu",
                                        "jax": {"hits": 3, "misses": 1, "saved_seconds": -2.5,
                                                "missed": [{"name": "jit_f", "key": "jit_f-" + "0" * 64}]}})
    for args in (["stats"], ["stats", "--json"], ["doctor", "--explain"], ["doctor", "--explain", "--json"]):
        result = run_cli(*args, "--cache-root", str(tmp_path))
        assert result.returncode == 0 and "Traceback" not in result.stderr, (args, result.stderr)
    usage = json.loads(run_cli("stats", "--json", "--cache-root", str(tmp_path)).stdout)["usage"]
    predict = usage["by_rule"]["predict"]
    assert predict["jax_hits"] == 3 and predict["jax_misses"] == 1
    assert predict["saved_seconds"] == 0.0  # a negative saving is not a saving
    assert sum(group["processes"] for group in usage["by_rule"].values()) == len(ODD_VALUES) + 1


def test_prune_bounds_the_records_by_age_and_cleans_half_written_ones(tmp_path):
    records = tmp_path / "records"
    for number in range(20):
        write_record(records, f"old-{number}.json", {"time": 0, "rule": "x"}, age_days=40)
    fresh = write_record(records, "fresh.json", {"time": time.time(), "rule": "x"})
    stale = write_record(records, ".half.json.tmp", '{"time": 1', age_days=2)
    young = write_record(records, ".young.json.tmp", '{"time": 1')
    result = run_cli("prune", "--json", "--cache-root", str(tmp_path))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)["records"]
    assert report["entries_removed"] == 21 and report["entries_before"] == 22
    assert sorted(p.name for p in records.iterdir()) == sorted([fresh.name, young.name])
    assert not stale.exists()
    stats = json.loads(run_cli("stats", "--json", "--cache-root", str(tmp_path)).stdout)
    assert stats["kinds"]["records"]["entries"] == 1


@pytest.mark.slow
def test_stats_on_a_cache_with_names_that_are_not_utf8(tmp_path):
    jax = tmp_path / "jax"
    jax.mkdir()
    name = os.fsdecode(b"jit_\xff-" + b"0" * 64 + b"-cache")
    (jax / name).write_bytes(b"")
    for args in (["stats"], ["stats", "--json"], ["prune", "--dry-run"], ["prune", "--dry-run", "--json"]):
        # The name prints as its own bytes (as ls does), so read bytes.
        result = subprocess.run([sys.executable, "-m", "gpu_cache", *args, "--cache-root", str(tmp_path)],
                                env=clean_environ(), capture_output=True, timeout=120)
        assert result.returncode == 0 and b"Traceback" not in result.stderr, (args, result.stderr)


STRANGER = """
rule all:
    input: "env.txt"

rule dump:
    output: "env.txt"
    shell: "env | grep -E '^(JAX_COMPILATION_CACHE_DIR|GPU_CACHE_ROOT)=' | sort > {output}"
"""


@pytest.mark.slow
def test_install_profile_from_a_path_with_yaml_syntax_in_it(tmp_path):
    checkout = tmp_path / "a #b: c"
    shutil.copytree(SCRIPTS, checkout / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "profiles", checkout / "profiles")
    profile = tmp_path / "profile"
    env = clean_environ(PYTHONPATH=str(checkout / "scripts"))
    result = run_cli("install-profile", "--target", str(profile), env=env)
    assert result.returncode == 0, result.stderr
    work = tmp_path / "work"
    work.mkdir()
    (work / "Snakefile").write_text(STRANGER)
    env = clean_environ(GPU_CACHE_ROOT=str(tmp_path / "cache"))
    env.pop("PYTHONPATH")  # only the installed profile can find gpu_cache
    run = run_snakemake(work, "--profile", str(profile), "--cores", "1", env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"JAX_COMPILATION_CACHE_DIR={tmp_path / 'cache' / 'jax'}" in (work / "env.txt").read_text()


@pytest.mark.slow
def test_install_profile_from_a_non_editable_install(tmp_path):
    """From the wheel in a fresh venv (tests/test_release.py checks what the wheel holds): the
    profile points at the installed package's own folder, site-packages/gpu-cache."""
    python = fresh_venv(tmp_path / "venv")
    install(python, build(tmp_path / "dist")[1])
    env = {k: v for k, v in clean_environ().items() if k != "PYTHONPATH"}
    result = subprocess.run([str(python), "-m", "gpu_cache", "install-profile", "--target",
                             str(tmp_path / "profile")], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    profile = (tmp_path / "profile" / "config.yaml").read_text()
    assert "export_from_profile" in profile
    assert re.search(r"gpu_cache_scripts = '[^']*/site-packages/gpu-cache'", profile), profile


@pytest.mark.parametrize("command", ["warm", "validate"])
def test_a_gpu_type_that_ends_in_a_newline_is_one_line_exit_2(command, tmp_path):
    result = run_cli(command, "--cache-root", str(tmp_path / "cache"), "--gpu-type", "a100\n",
                     "--output", str(tmp_path / "out.json"))
    assert "a GPU type is letters" in one_line_error(result)
    assert not (tmp_path / "out.json").exists()


#: Text a record may hold to drive a terminal or forge a report line.
HOSTILE_TEXT = "x\x1b]0;owned\x07\x1b[2J\u202e\nexplain: cpu on cpu: PASSED\r"


def test_text_from_records_reaches_no_terminal_raw(tmp_path):
    records = tmp_path / "records"
    now = time.time()
    record = {"time": now, "rule": HOSTILE_TEXT, "host": HOSTILE_TEXT, "gpu_type": HOSTILE_TEXT,
              "run_id": HOSTILE_TEXT, "jax": {"requests": 2, "hits": 0, "misses": 2,
                                              "missed": [{"name": HOSTILE_TEXT, "key": HOSTILE_TEXT}]}}
    write_record(records, "1.json", record)
    write_record(records, "2.json", {**record, "time": now + 1})
    for args in (["stats"], ["doctor", "--explain"]):
        result = run_cli(*args, "--cache-root", str(tmp_path))
        assert result.returncode == 0, result.stderr
        out = result.stdout + result.stderr
        assert not any(char in out for char in "\x1b\x07\r\u202e"), (args, out)
        assert "\\x1b]0;owned\\x07" in result.stdout, (args, result.stdout)  # shown, escaped
        assert not [line for line in out.splitlines() if line.startswith("explain: cpu on cpu")], out
    data = json.loads(run_cli("stats", "--json", "--cache-root", str(tmp_path)).stdout)
    assert HOSTILE_TEXT in data["usage"]["by_rule"]  # --json keeps the value (JSON escapes it)


def raw_control(text: str) -> list[str]:
    """The lines of ``text`` that hold what a terminal would act on, or that a report forged."""
    return [line for line in text.splitlines(keepends=True)
            if any(char in line for char in "\x1b\x07\r\u202e") or line.startswith("explain: cpu on cpu")]


def test_validate_and_summary_show_text_from_records_and_verdicts_escaped(tmp_path):
    """What a validate pass's records and runs said (a missed function's name, a workload's last
    words, the device and software the jobs saw) reaches validate's stderr and the summary of
    its verdicts only escaped, one line each."""
    ran = {"workload": HOSTILE_TEXT, "shape": HOSTILE_TEXT, "seconds": 1.0, "returncode": 0}
    phase = {"phase": "validate", "gpu_type": "cpu", "run_id": "r", "runs": [ran], "expects": ["jax"],
             "recorded": {"jax": {"processes": 1, "hits": 0, "misses": 1,
                                  "missed": [{"kind": "jax", "name": HOSTILE_TEXT, "key": HOSTILE_TEXT}]}},
             "device": {"name": HOSTILE_TEXT}, "software": {"python": HOSTILE_TEXT, "jax": HOSTILE_TEXT}}
    broken = {**phase, "runs": [{**ran, "returncode": 1, "error": HOSTILE_TEXT}]}  # status "error"
    write_record(tmp_path / "cache" / "records", "1.json", {  # the pass's process, as the hook wrote it
        "time": time.time(), "run_id": "r", "host": HOSTILE_TEXT,
        "jax": {"requests": 1, "hits": 0, "misses": 1, "missed": [{"name": HOSTILE_TEXT, "key": "k"}]}})
    verdicts = []
    for name, found in (("missed", phase), ("error", broken)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"validate": found}))
        verdicts.append(tmp_path / f"verdict-{name}.json")
        result = run_cli("validate", "--phases", str(tmp_path / f"{name}.json"), "--gpu-type", "cpu",
                         "--cache-root", str(tmp_path / "cache"), "--output", str(verdicts[-1]))
        assert result.returncode == 0 and "validation of cpu failed" in result.stderr, result.stderr
        assert raw_control(result.stderr) == [] and "\\x1b]0;owned\\x07" in result.stderr, result.stderr
    problems = json.loads(verdicts[0].read_text())["problems"]
    assert any(f"missed in a fresh process after warming: {HOSTILE_TEXT}" in p for p in problems)
    summary = run_cli("summary", "--validate", *map(str, verdicts))
    assert summary.returncode == 1 and "gpu-cache: ERROR: GPU type cpu: " in summary.stderr
    assert raw_control(summary.stdout + summary.stderr) == [], summary.stdout + summary.stderr
    assert "\\x1b]0;owned\\x07" in summary.stdout and "\\x1b]0;owned\\x07" in summary.stderr
