"""Replay of recorded Triton kernels (issue 26): the startup hook describes each kernel a
process compiles, and ``gpu_cache.workloads.triton_replay`` compiles them again, in parallel,
into an empty cache, where a later process then hits every one.

Real Triton compiles ahead of time for sm_90 on this CPU (the wheel's ptxas); nothing mocked.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpu_cache.core import hook_records, kinds, runner
from gpu_cache.core.kinds import triton_replay
from gpu_cache.core.reports import PhaseResult
from helpers import HOOK, REPO, SCRIPTS, clean_environ

SHAPE = "256"
KERNELS = 5  # the triton-kernels workload's kernels for one target


def _env(cache: Path, records: Path | None = None, **extra: str) -> dict[str, str]:
    mine = {"TRITON_CACHE_DIR": str(cache), "TRITON_DEFAULT_FP_FUSION": "1"}
    if records is not None:  # the startup hook, writing records there
        mine |= {"GPU_CACHE_RECORDS": str(records), "PYTHONPATH": f"{HOOK}:{SCRIPTS}"}
    return clean_environ(**(mine | extra))


def _run(module: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, *args], env=env, capture_output=True,
                          text=True, cwd=REPO, check=False, timeout=600)


def _summary(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _workload(cache: Path, records: Path | None = None) -> dict[str, Any]:
    return _summary(_run("gpu_cache.workloads.triton_kernels", _env(cache, records), "--shape", SHAPE,
                         "--mode", "aot", "--targets", "sm_90"))


def _replay(cache: Path, records: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _run("gpu_cache.workloads.triton_replay", _env(cache), "--records", str(records), *args)


def _kernels_of(records: Path) -> list[dict[str, Any]]:
    return [k for r in hook_records.read(records) for k in r["triton"]["kernels"]]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The records of one process that compiled the workload's kernels (read-only for tests)."""
    base = tmp_path_factory.mktemp("recorded")
    summary = _workload(base / "cache", base / "records")
    assert summary["misses"] == KERNELS
    return base / "records"


def test_each_compiled_kernel_is_described_once(recorded: Path) -> None:
    (record,) = list(hook_records.read(recorded))
    part = record["triton"]
    assert part["misses"] == KERNELS and part["dropped"]["kernels"] == 0
    kernels = part["kernels"]
    assert len(kernels) == KERNELS
    assert {k["qualname"] for k in kernels} == {"vector_add_kernel", "row_softmax_kernel",
                                                "tiled_matmul_kernel"}
    for kernel in kernels:
        assert kernel["module"] == "gpu_cache.workloads.triton_kernels"
        assert kernel["target"] == {"backend": "cuda", "arch": 90, "warp_size": 32}
        assert kernel["key"] in {m["key"] for m in part["missed"]}
    matmuls = [k for k in kernels if k["qualname"] == "tiled_matmul_kernel"]
    # num_warps=8 differs from the backend's default (4): only options the launch set are kept
    assert [k["options"] for k in matmuls] == [{}, {"num_warps": 8}, {"num_stages": 4}]
    assert triton_replay.kernels([record, record]) == kernels  # deduplicated when read


def test_replay_fills_an_empty_cache_that_a_later_process_hits(recorded: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    replay = _summary(_replay(cache, recorded, "--jobs", "2"))
    assert replay["processes"] == 2
    assert (replay["compiled"], replay["cached"], replay["failed"], replay["skipped"]) == (KERNELS, 0, 0, 0)
    assert replay["same_key"] == replay["key_checked"] == KERNELS  # the job's very keys
    later = _workload(cache)
    assert (later["hits"], later["misses"]) == (KERNELS, 0)
    again = _summary(_replay(cache, recorded, "--jobs", "1"))
    assert (again["compiled"], again["cached"], again["processes"]) == (0, KERNELS, 1)


def _as_older(kernel: dict[str, Any]) -> dict[str, Any]:
    """``kernel`` as Triton 3.6 and an older version of its package described it: another key,
    no attributes for arguments it does not specialise (Triton 3.9 lists them empty: another
    ``src.hash()``), an option this Triton does not know."""
    return {**kernel, "triton": "3.6.0", "version": "0.0.1", "key": "OLDERKEY",
            "attrs": [pair for pair in kernel["attrs"] if pair[1]],
            "options": {**kernel["options"], "option_of_an_older_triton": 1}}


def test_records_of_another_version_replay_with_the_installed_one(recorded: Path, tmp_path: Path) -> None:
    (record,) = list(hook_records.read(recorded))
    kernels = [_as_older(k) for k in record["triton"]["kernels"]]
    gone = {**kernels[0], "module": "a_package_that_is_gone.kernels"}
    renamed = {**kernels[1], "signature": {("input_ptr" if k == "in_ptr" else k): v
                                           for k, v in kernels[1]["signature"].items()}}
    records = tmp_path / "records"
    records.mkdir()
    record["triton"]["kernels"] = [*kernels, gone, renamed]
    (records / "1-older.json").write_text(json.dumps(record))
    cache = tmp_path / "cache"
    proc = _replay(cache, records, "--jobs", "2", "--targets", "sm_90")
    replay = _summary(proc)
    assert (replay["compiled"], replay["skipped"], replay["failed"]) == (KERNELS, 2, 0)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2, proc.stderr
    assert "a_package_that_is_gone.kernels does not import: ModuleNotFoundError" in lines[0]
    assert "the signature no longer binds" in lines[1] and "input_ptr" in lines[1]
    later = _workload(cache)
    assert (later["hits"], later["misses"]) == (KERNELS, 0)


#: The Python of another Triton (e.g. a venv with triton 3.6.0), for the replay across real
#: versions in both directions; the test is skipped without it.
OTHER_TRITON = os.environ.get("GPU_CACHE_TEST_OTHER_TRITON")


@pytest.mark.skipif(not OTHER_TRITON, reason="GPU_CACHE_TEST_OTHER_TRITON names no Python of another Triton")
def test_replay_across_real_triton_versions(tmp_path: Path) -> None:
    other = [str(OTHER_TRITON)]
    for recorder, replayer in ((other, [sys.executable]), ([sys.executable], other)):
        base = tmp_path / Path(recorder[0]).name
        env = _env(base / "first", base / "records")
        made = subprocess.run([*recorder, "-m", "gpu_cache.workloads.triton_kernels", "--shape", "1000",
                               "--mode", "aot"], env=env, capture_output=True, text=True, check=False)
        assert _summary(made)["misses"] == KERNELS
        env = _env(base / "replayed")
        replay = _summary(subprocess.run([*replayer, "-m", "gpu_cache.workloads.triton_replay", "--records",
                                          str(base / "records")], env=env, capture_output=True,
                                         text=True, check=False))
        assert replay["compiled"] == KERNELS
        later = _summary(subprocess.run([*replayer, "-m", "gpu_cache.workloads.triton_kernels", "--shape",
                                         "1000", "--mode", "aot"], env=env, capture_output=True, text=True,
                                        check=False))
        assert (later["hits"], later["misses"]) == (KERNELS, 0)


def test_replay_of_other_targets_only_and_of_no_records(recorded: Path, tmp_path: Path) -> None:
    replay = _summary(_replay(tmp_path / "cache", recorded, "--targets", "sm_80"))
    assert (replay["described"], replay["replayed"]) == (KERNELS, 0)
    (tmp_path / "empty").mkdir()
    assert _summary(_replay(tmp_path / "cache", tmp_path / "empty")) == {"workload": "triton-replay",
                                                                        "described": 0}


@pytest.mark.parametrize("args", [["--jobs", "0"], ["--targets", "90"], ["--records", "relative"]])
def test_bad_arguments_are_one_line_and_exit_2(args: list[str], recorded: Path, tmp_path: Path) -> None:
    proc = _run("gpu_cache.workloads.triton_replay", _env(tmp_path / "cache"),
                "--records", str(recorded), *args)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


_BOUNDED = """
import sys, triton
from gpu_cache.workloads import triton_kernels as tk
hook = sys.modules["gpu_cache_hook.kinds.triton"]
setattr(hook, sys.argv[1], int(sys.argv[2]))
tk.run_aot(256, [90])
# The same kernels compiled again (in-memory binders dropped, the disk cache bypassed): more
# misses, no more descriptions.
for kernel in (tk.vector_add_kernel, tk.row_softmax_kernel, tk.tiled_matmul_kernel):
    kernel.device_caches.clear()
triton.knobs.compilation.always_compile = True
tk.run_aot(256, [90])
"""


@pytest.mark.parametrize(("bound", "value", "kept"), [
    ("MAX_KERNELS", 200, KERNELS), ("MAX_KERNELS", 2, 2), ("KERNEL_BYTES", 100, 0),
    ("KERNELS_BYTES", 2500, None)])
@pytest.mark.slow
def test_descriptions_are_bounded_and_deduplicated(bound: str, value: int, kept: int | None,
                                                   tmp_path: Path) -> None:
    records = tmp_path / "records"
    env = _env(tmp_path / "cache", records)
    proc = subprocess.run([sys.executable, "-c", _BOUNDED, bound, str(value)], env=env,
                          capture_output=True, text=True, cwd=REPO, check=False, timeout=600)
    assert proc.returncode == 0, proc.stderr
    (record,) = list(hook_records.read(records))
    part = record["triton"]
    assert part["misses"] == 2 * KERNELS
    described = len(part["kernels"])
    assert described == kept if kept is not None else 0 < described < KERNELS
    assert part["dropped"]["kernels"] == KERNELS - described  # each kernel counted once
    if bound == "KERNELS_BYTES":
        assert sum(len(json.dumps(k, sort_keys=True)) for k in part["kernels"]) <= value


def test_odd_descriptions_are_passed_over() -> None:
    good = {"module": "m", "qualname": "k", "signature": {}, "constants": [], "attrs": [],
            "options": {}, "target": {}}
    odd = [["not", "a", "dict"], {**good, "constants": [[0, 1]]}, {**good, "signature": []}, "x", None]
    records = [{"time": 1.0, "triton": {"kernels": [*odd, good]}}, {"time": 2.0, "triton": {"kernels": "x"}},
               {"time": 3.0, "triton": {"kernels": [{**good, "key": "K", "triton": "3.6.0"}]}}]
    # one kernel, as the latest record describes it
    assert triton_replay.kernels(records) == [{**good, "key": "K", "triton": "3.6.0"}]


def test_a_warm_pass_replays_the_recorded_kernels_first(recorded: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    records = kinds.records_dir(root)
    shutil.copytree(recorded, records)
    triton_dir = kinds.KINDS["triton"].folder(root)
    plan = runner.Plan("warm", "h200", (), parallel=1)
    environ = _env(triton_dir, records, GPU_CACHE_ROOT=str(root))
    with (tmp_path / "log").open("w+") as log:
        result: PhaseResult = runner.run_plan(plan, log, environ)
        log.seek(0)
        output = log.read()
    assert [(r.workload, r.ok) for r in result.runs] == [("triton-replay", True)], output
    assert len(result.new_keys["triton"]) == KERNELS
    assert '"compiled": 5' in output


FIXTURES = REPO / "tests" / "fixtures"
#: The fixture's tuning key: its key argument ``n`` and the dtype of each pointer argument.
TUNING_KEY = [4096, "fp32", "fp32"]


def _autotuned(cache: Path, how: str, records: Path | None = None) -> dict[str, Any]:
    """Run the fixture's ``triton.autotune``d kernel (tests/fixtures/triton_autotuned.py)."""
    env = _env(cache, records, TRITON_CACHE_AUTOTUNING="1", PYTHONPATH=f"{HOOK}:{SCRIPTS}:{FIXTURES}")
    proc = subprocess.run([sys.executable, "-c", f"import triton_autotuned; triton_autotuned.main({how!r})"],
                          env=env, capture_output=True, text=True, cwd=REPO, check=False, timeout=600)
    return _summary(proc)


def _autotune_files(cache: Path) -> dict[str, bytes]:
    return {str(p.relative_to(cache)): p.read_bytes() for p in cache.glob("*/*.autotune.json")}


@pytest.mark.slow  # four processes that tune, replay and check: 3 s
def test_replay_writes_the_autotune_choice_a_later_process_takes(tmp_path: Path) -> None:
    first, records = tmp_path / "first", tmp_path / "records"
    tuned = _autotuned(first, "tune", records)
    assert tuned == {"chosen": {"BLOCK": 128, "num_warps": 4, "num_ctas": 1, "num_stages": 3},
                     "benchmarked": 3}
    (record,) = list(hook_records.read(records))
    (choice,) = record["triton"]["autotuned"]
    assert (choice["module"], choice["qualname"], choice["chosen"]) == ("triton_autotuned", "scale_kernel", 1)
    assert choice["key"] == TUNING_KEY and len(choice["configs_timings"]) == 3
    triton_wrote = _autotune_files(first)  # what Triton itself kept, under its own key
    assert len(triton_wrote) == 1 and b"Infinity" in next(iter(triton_wrote.values()))  # a failed config

    second = tmp_path / "second"
    env = _env(second, PYTHONPATH=f"{SCRIPTS}:{FIXTURES}")
    replay = _summary(_run("gpu_cache.workloads.triton_replay", env, "--records", str(records)))
    assert (replay["compiled"], replay["autotune_recorded"], replay["autotune_written"]) == (3, 1, 1)
    assert _autotune_files(second) == triton_wrote  # the same key folder, byte for byte
    # Triton's own loader (Autotuner.check_disk_cache) takes it: nothing benchmarked, same choice
    assert _autotuned(second, "check") == {**tuned, "benchmarked": 0}
    again = _summary(_run("gpu_cache.workloads.triton_replay", env, "--records", str(records)))
    assert (again["cached"], again["autotune_written"], again["autotune_present"]) == (3, 0, 1)

    # a choice recorded under another Triton is keyed otherwise there: skipped, one line
    record["triton"]["autotuned"] = [{**choice, "triton": "3.6.0"}]
    record["triton"]["kernels"] = []
    older = tmp_path / "older"
    older.mkdir()
    (older / "1-older.json").write_text(json.dumps(record))
    third = _env(tmp_path / "third", PYTHONPATH=f"{SCRIPTS}:{FIXTURES}")
    proc = _run("gpu_cache.workloads.triton_replay", third, "--records", str(older))
    summary = _summary(proc)
    assert (summary["autotune_written"], summary["autotune_skipped"]) == (0, 1)
    assert "1 autotune choices recorded under triton 3.6.0 not written" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not _autotune_files(tmp_path / "third")


@pytest.mark.skipif(not OTHER_TRITON, reason="GPU_CACHE_TEST_OTHER_TRITON names no Python of another Triton")
def test_autotune_choices_under_another_real_triton(tmp_path: Path) -> None:
    """The same round trip under e.g. Triton 3.6 (the H200's), whose autotuner has no listener."""
    def run(cache: Path, code: str, records: Path | None = None) -> dict[str, Any]:
        env = _env(cache, records, TRITON_CACHE_AUTOTUNING="1", PYTHONPATH=f"{HOOK}:{SCRIPTS}:{FIXTURES}")
        return _summary(subprocess.run([str(OTHER_TRITON), "-c", code], env=env, capture_output=True,
                                       text=True, cwd=REPO, check=False, timeout=600))

    records = tmp_path / "records"
    tuned = run(tmp_path / "first", "import triton_autotuned as t; t.main('tune')", records)
    replay = run(tmp_path / "second", f"from gpu_cache.workloads import triton_replay as r; "
                                      f"r.main(['--records', {str(records)!r}])")
    assert replay["autotune_written"] == 1
    assert _autotune_files(tmp_path / "second") == _autotune_files(tmp_path / "first")
    checked = run(tmp_path / "second", "import triton_autotuned as t; t.main('check')")
    assert checked == {**tuned, "benchmarked": 0}


def _deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"tuple": [value]}
    return value


#: Descriptions no hook writes, each made from a good one: (what, how the kernel changes).
ODD = {
    "a tuple of a number": lambda k: {**k, "signature": {**k["signature"], "n_elements": {"tuple": 5}}},
    "a float of text": lambda k: {**k, "constants": [[[0], {"float": "many"}]]},
    "a float of a list": lambda k: {**k, "constants": [[[0], {"float": [1]}]]},
    "nesting 300 deep": lambda k: {**k, "constants": [[[0], _deep(150)]]},
    "a JIT function in the options": lambda k: {**k, "options": {"num_warps": {"jit_function": "os:path"}}},
    "a dtype in the options": lambda k: {**k, "options": {"num_warps": {"dtype": "fp32"}}},
    "a dtype of a number": lambda k: {**k, "signature": {**k["signature"], "n_elements": {"dtype": 5}}},
    "two tags": lambda k: {**k, "constants": [[[0], {"tuple": [], "float": 1}]]},
    "an arch of a list": lambda k: {**k, "target": {**k["target"], "arch": [90]}},
    "a path of text": lambda k: {**k, "attrs": [[["x"], []]]},
}


def test_an_odd_description_is_one_skipped_kernel_with_one_line(recorded: Path, tmp_path: Path) -> None:
    (record,) = list(hook_records.read(recorded))
    good = record["triton"]["kernels"]
    vector_add = next(k for k in good if k["qualname"] == "vector_add_kernel")
    record["triton"]["kernels"] = [*good, *(make(vector_add) for make in ODD.values())]
    records = tmp_path / "records"
    records.mkdir()
    (records / "1-odd.json").write_text(json.dumps(record))
    proc = _replay(tmp_path / "cache", records, "--jobs", "1")
    replay = _summary(proc)  # exit 0 and its JSON line
    assert "Traceback" not in proc.stderr
    assert (replay["compiled"], replay["skipped"], replay["failed"]) == (KERNELS, len(ODD), 0), proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == len(ODD) and all(line.startswith("triton-replay: skipped ") for line in lines), lines


#: A module that says so when it is imported.
MARKER_MODULE = "import pathlib, os\npathlib.Path(os.environ['IMPORTED_MARKER']).write_text('imported')\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's record needs root (chown)")
@pytest.mark.parametrize("how", ["another user's", "one others may write"])
def test_the_replay_never_takes_a_record_another_user_could_have_written(recorded: Path, tmp_path: Path,
                                                                        how: str) -> None:
    (record,) = list(hook_records.read(recorded))
    evil = {**record["triton"]["kernels"][0], "module": "planted_module"}
    record["triton"]["kernels"] = [evil]
    records = tmp_path / "records"
    records.mkdir()
    planted = records / "1-planted.json"
    planted.write_text(json.dumps(record))
    if how == "another user's":
        shutil.chown(planted, user="nobody")
    else:
        planted.chmod(0o666)
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "planted_module.py").write_text(MARKER_MODULE)
    marker = tmp_path / "imported"
    env = _env(tmp_path / "cache", IMPORTED_MARKER=str(marker), PYTHONPATH=f"{tmp_path / 'lib'}:{SCRIPTS}")
    proc = _run("gpu_cache.workloads.triton_replay", env, "--records", str(records))
    assert _summary(proc) == {"workload": "triton-replay", "described": 0}
    assert not marker.exists(), "the replay imported a module another user's record named"


def test_a_recorded_key_this_triton_does_not_compile_is_counted_apart(recorded: Path, tmp_path: Path) -> None:
    """Two records name keys other than those this Triton computes for their kernels (a job
    under other cache-invalidating settings, say): the replay compiles all five and says that
    three of five came out under the recorded key (the summary warm reads), not five."""
    (record,) = list(hook_records.read(recorded))
    kernels = record["triton"]["kernels"]
    for kernel in kernels[:2]:
        kernel["key"] = "A" * len(kernel["key"])
    records = tmp_path / "records"
    records.mkdir()
    (records / "1-other-keys.json").write_text(json.dumps(record))
    replay = _summary(_replay(tmp_path / "cache", records, "--jobs", "1"))
    assert (replay["compiled"], replay["failed"]) == (KERNELS, 0)
    assert (replay["same_key"], replay["key_checked"]) == (KERNELS - 2, KERNELS)


@pytest.mark.slow  # two Triton processes: 2.3 s on an idle 2-core machine
def test_an_autotune_choice_whose_kernel_source_changed_is_not_written(tmp_path: Path) -> None:
    """The tuned kernel's source changes between the job that tuned it and the replay (a new
    version of its package): the choice is not written (one line), so a later process tunes
    the new kernel itself instead of taking a choice measured on the old one."""
    package = tmp_path / "package"
    package.mkdir()
    shutil.copy(FIXTURES / "triton_autotuned.py", package)
    records, tuned = tmp_path / "records", tmp_path / "tuned"
    env = _env(tuned, records, TRITON_CACHE_AUTOTUNING="1", PYTHONPATH=f"{HOOK}:{SCRIPTS}:{package}")
    _summary(subprocess.run([sys.executable, "-c", "import triton_autotuned; triton_autotuned.main('tune')"],
                            env=env, capture_output=True, text=True, cwd=tmp_path, timeout=600))
    source = package / "triton_autotuned.py"
    source.write_text(source.read_text().replace("* 2.0, mask=mask)", "* 3.0, mask=mask)"))
    cache = tmp_path / "cache"
    proc = _run("gpu_cache.workloads.triton_replay", _env(cache, PYTHONPATH=f"{SCRIPTS}:{package}"),
                "--records", str(records))
    summary = _summary(proc)
    assert (summary["autotune_written"], summary["autotune_skipped"]) == (0, 1)
    assert "autotune choice of triton_autotuned:scale_kernel not written: its source changed" in proc.stderr
    assert not _autotune_files(cache)
