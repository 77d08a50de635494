"""jax-triton's kernels as a cache kind (issue 34): the startup hook keeps each kernel that
jax-triton compiles while JAX lowers (real lowerings for CUDA on this CPU, the Triton compile
included), and a later process lowers the same module from them; its inventory; the trust
rules and modes of its entries; jax-triton's TRITON_CACHE_DIR="" undone; a version the hook
does not know left alone."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_cache._hook.gpu_cache_hook import digest
from gpu_cache.config.settings import settings_from
from gpu_cache.core.kinds import jax_triton_format as kernel_cache
from gpu_cache.jobenv import env
from helpers import HOOK, REPO, SCRIPTS, clean_environ, read_json, records, run_cli, unavailable

#: The workload's five tiled matmuls, without the attention: the lead's check.
MATMULS = ("--kernels", "matmul")
#: jaxlib's CUDA plugin, which jax-triton imports: installed by .ci/run apart from
#: site-packages (there it makes every `import jax` of the suite print CUDA warnings).
PLUGIN = Path(os.environ.get("GPU_CACHE_TEST_JAX_CUDA_PLUGIN") or REPO / ".ci-cache" / "jax-cuda12-plugin")


def needs_jax_triton() -> None:
    if importlib.util.find_spec("jax_triton") is None:
        unavailable("jax-triton is not installed (the test extra has it)")
    if not (PLUGIN / "jax_cuda12_plugin").is_dir():
        unavailable(f"no jax-cuda12-plugin in {PLUGIN} (.ci/run installs it there)")


def plugin_environ(**extra: str) -> dict[str, str]:
    """A clean environment whose processes import jax with its CUDA plugin (no GPU: lowering)."""
    return clean_environ(PYTHONPATH=f"{SCRIPTS}{os.pathsep}{PLUGIN}", **extra)


def job_env(root: Path, config: dict | None = None, **extra: str) -> dict[str, str]:
    """A job's environment as ``gpu-cache env`` exports it for ``root`` (the hook first on
    PYTHONPATH)."""
    base = plugin_environ()
    exports = env.resolve(settings_from(config or {}, cache_root=str(root)), base)
    return env.job_environ(exports, base, **extra)


def lower(environ: dict[str, str], *args: str, module_out: Path | None = None,
          umask: int | None = None) -> tuple[dict, subprocess.CompletedProcess[str]]:
    """One process of the jax-triton workload, lowering for CUDA (sm_90): its JSON line."""
    command = [sys.executable, "-m", "gpu_cache.workloads.jax_triton_kernels", "--shape", "256",
               "--mode", "lower", *args]
    if module_out is not None:
        command += ["--module-out", str(module_out)]
    done = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=600,
                          preexec_fn=(lambda: os.umask(umask)) if umask is not None else None)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done


def warnings(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("gpu-cache: warning")]


def entries(root: Path) -> list[Path]:
    return sorted(p for p in (root / "jax_triton").iterdir() if kernel_cache.KEY_RE.fullmatch(p.name))


# --- the inventory (no jax-triton needed) -----------------------------------------------------

def _entry(key: str, kernel: str = "matmul_kernel") -> bytes:
    body = {"format": kernel_cache.FORMAT, "key": key, "kernel": kernel, "module": "m", "name": "k",
            "jax_triton": "0.3.1", "triton": "3.9.0", "target": "sm_90", "compile_seconds": 0.1,
            "parts": {}, "result": {"binary": "ptx", "name": "k", "shared_mem_bytes": 0,
                                    "ttgir": None, "llir": None}, "ttir": "module {}"}
    return digest.framed(json.dumps(body).encode())


def test_the_inventory_names_kernels_and_finds_broken_entries(tmp_path):
    folder = tmp_path / "jax_triton"
    folder.mkdir()
    good, wrong_key, not_json, empty = ("a" * 64, "b" * 64, "c" * 64, "d" * 64)
    (folder / good).write_bytes(_entry(good))
    (folder / wrong_key).write_bytes(_entry(good))
    (folder / not_json).write_bytes(digest.framed(b"{\"format\": 1, truncated"))
    (folder / empty).write_bytes(b"")
    (folder / "notes.txt").write_text("mine")
    (folder / ".triton-keys").mkdir()
    (folder / ".triton-keys" / ("e" * 32)).write_text("triton key")
    (folder / f"{kernel_cache.TEMP_PREFIX}host.1.abc").write_bytes(b"partial")  # young: its writer's
    stale = folder / f".{good}.99.0123abcd.tmp"  # unpack's, killed an hour ago
    stale.write_bytes(b"partial")
    old = time.time() - 7200
    os.utime(stale, (old, old))
    (folder / ("f" * 64)).symlink_to(folder / good)
    found = {e.key: e for e in kernel_cache.scan(folder, grace_seconds=3600.0, verify_after=0.0)}
    assert found[good].problem is None and found[good].name == "matmul_kernel"
    assert found[wrong_key].problem == "its key is not its file name"
    assert found[not_json].problem.startswith("unreadable entry")
    assert found[empty].problem == "an empty file"
    assert found["notes.txt"].problem.startswith("not a jax-triton kernel entry")
    assert found[stale.name].problem == "stale temporary file of a killed writer"
    assert found["f" * 64].problem.startswith("a symbolic link")
    assert set(found) == {good, wrong_key, not_json, empty, "notes.txt", stale.name, "f" * 64}
    # without verification an entry is named from its head, and judged only where that fails
    plain = {e.key: e for e in kernel_cache.scan(folder, grace_seconds=3600.0)}
    assert plain[wrong_key].problem is None and plain[not_json].problem is not None
    kernel_cache.remove(folder, found["f" * 64])
    assert not os.path.lexists(folder / ("f" * 64)) and (folder / good).exists()


@pytest.mark.parametrize("change", ["format", "result", "binary", "a float in the result", "one character",
                                    "no frame"])
def test_an_entry_of_another_shape_is_a_problem(change):
    key = "a" * 64
    data = json.loads(digest.opened(_entry(key)))
    if change == "format":
        data["format"] = 2
    elif change == "result":
        data["result"] = "ptx"
    elif change == "binary":
        del data["result"]["binary"]
    elif change == "a float in the result":
        data["result"]["shared_mem_bytes"] = 1.5
    framed = digest.framed(json.dumps(data).encode())
    if change == "one character":
        framed = framed.replace(b"module {}", b"module {]")
    elif change == "no frame":  # format 2's: the JSON alone
        framed = json.dumps(data).encode()
    assert kernel_cache.problem_in(framed, key) is not None
    assert kernel_cache.problem_in(_entry(key), key) is None


# --- real lowerings ---------------------------------------------------------------------------

@pytest.mark.slow
def test_a_second_process_lowers_the_same_module_from_the_kept_kernels(tmp_path):
    """The lead's check: a second process's lowering of 5 matmul kernels takes at most 0.3x the
    first's and gives the same module, which is also what jax-triton lowers without the hook."""
    needs_jax_triton()
    root = tmp_path / "root"
    environ = job_env(root)
    first, _ = lower(environ, *MATMULS, module_out=tmp_path / "first.mlir")
    second, done = lower(environ, *MATMULS, module_out=tmp_path / "second.mlir")
    assert second["lower_seconds"][0] <= 0.3 * first["lower_seconds"][0], (first, second)
    assert (tmp_path / "second.mlir").read_text() == (tmp_path / "first.mlir").read_text()
    sections = records(root, "jax_triton")
    assert [(s["misses"], s["hits"]) for s in sections] == [(5, 0), (0, 5)]
    assert sections[1]["state"] == "on" and sections[1]["triton_key"] == "kept"
    assert sorted(sections[1]["hit_keys"]) == [p.name for p in entries(root)]
    assert warnings(done) == []
    lower(plugin_environ(), *MATMULS, module_out=tmp_path / "plain.mlir")  # no hook, no cache
    assert (tmp_path / "plain.mlir").read_text() == (tmp_path / "first.mlir").read_text()


@pytest.mark.slow
def test_triton_cache_dir_is_put_back_after_jax_triton_clears_it(tmp_path):
    """jax-triton sets TRITON_CACHE_DIR="" on import, and every later Triton compile of the
    process raises; under the hook the folder is put back and Triton compiles into it."""
    needs_jax_triton()
    root = tmp_path / "root"
    program = ("import os, sys, jax_triton\n"
               "print(repr(os.environ['TRITON_CACHE_DIR']), flush=True)\n"
               "from gpu_cache.workloads import triton_kernels\n"
               "sys.exit(triton_kernels.main(['--shape', '64', '--mode', 'aot']))\n")
    environ = job_env(root)
    done = subprocess.run([sys.executable, "-c", program], env=environ, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[0] == repr(environ["TRITON_CACHE_DIR"])
    assert len(list((root / "triton").iterdir())) >= 5
    assert records(root, "jax_triton")[0]["triton_cache_dir"] == f"restored {environ['TRITON_CACHE_DIR']}"
    plain = dict(environ, PYTHONPATH=os.pathsep.join(p for p in environ["PYTHONPATH"].split(os.pathsep)
                                                     if p != str(HOOK)))
    done = subprocess.run([sys.executable, "-c", program], env=plain, capture_output=True, text=True,
                          timeout=600)
    assert done.stdout.splitlines()[0] == "''" and done.returncode != 0


@pytest.mark.slow
def test_a_jax_triton_the_hook_does_not_know_is_left_untouched(tmp_path):
    """The installed jax-triton with another version number: nothing kept, nothing put back, and
    the record says why."""
    needs_jax_triton()
    site = tmp_path / "site"
    shutil.copytree(Path(importlib.util.find_spec("jax_triton").origin).parent, site / "jax_triton",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (site / "jax_triton" / "version.py").write_text('__version_info__ = (0, 9, 0)\n'
                                                    '__version__ = "0.9.0"\n')
    root = tmp_path / "root"
    environ = job_env(root)
    environ["PYTHONPATH"] = environ["PYTHONPATH"].replace(str(HOOK), f"{HOOK}{os.pathsep}{site}", 1)
    for _ in range(2):
        _summary, done = lower(environ, *MATMULS)
        assert warnings(done) == []
    assert entries(root) == []
    for section in records(root, "jax_triton"):
        assert section["state"].startswith("untouched: jax-triton 0.9.0 is not a version this hook knows")
        assert section["hits"] == section["misses"] == 0 and section["triton_cache_dir"] is None


@pytest.fixture(scope="module")
def warmed(tmp_path_factory) -> Path:
    """A cache root whose kernel folder holds the workload's five matmuls, kept by one process."""
    needs_jax_triton()
    root = tmp_path_factory.mktemp("warmed") / "root"
    lower(job_env(root), *MATMULS)
    assert len(entries(root)) == 5
    return root


def _copy(warmed: Path, tmp_path: Path) -> Path:
    root = tmp_path / "root"
    shutil.copytree(warmed, root, symlinks=True)
    shutil.rmtree(root / "records")
    return root


def _plant(root: Path, how: str) -> None:
    folder = root / "jax_triton"
    victim = entries(root)[0]
    if how == "others can write the folder":
        folder.chmod(0o777)
    elif how == "an entry is a link":
        outside = root.parent / "elsewhere"
        shutil.copy(victim, outside)
        victim.unlink()
        victim.symlink_to(outside)
    elif how == "an entry belongs to another user":
        os.chown(victim, 65534, 65534)
    elif how == "others can write an entry":
        victim.chmod(0o666)
    else:
        victim.write_bytes(b"{\"format\": 1, ")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["others can write the folder", "an entry is a link",
                                 "an entry belongs to another user", "others can write an entry",
                                 "an entry is cut short"])
def test_kernels_are_loaded_only_from_what_no_other_user_could_have_written(warmed, tmp_path, how):
    root = _copy(warmed, tmp_path)
    environ = job_env(root)  # exported while the folder was sound
    _plant(root, how)
    victim = entries(root)[0]
    summary, done = lower(environ, *MATMULS)
    section = records(root, "jax_triton")[0]
    if how == "others can write the folder":  # nothing read, nothing written; one warning line
        assert section["state"].startswith("off:") and "writable by everyone" in section["state"]
        assert (section["hits"], section["misses"]) == (0, 0)
        assert len(warnings(done)) == 1
        exports = env.resolve(settings_from({}, cache_root=str(root)), clean_environ())
        assert "writable" in exports.problems["jax_triton"]  # gpu-cache env refuses it too
        assert exports.values["GPU_CACHE_JAX_TRITON"] != str(root / "jax_triton")
        return
    assert (section["hits"], section["misses"]) == (4, 1) and len(section["refused"]) == 1
    assert warnings(done) == []
    info = os.lstat(victim)  # compiled again, and put in its place
    assert info.st_uid == os.geteuid() and oct(info.st_mode & 0o7777) == "0o644"
    assert kernel_cache.problem_in(victim.read_bytes(), victim.name) is None
    assert summary["lower_seconds"]


@pytest.mark.slow
def test_entries_are_written_whole_with_safe_modes_whatever_the_umask(tmp_path):
    needs_jax_triton()
    root = tmp_path / "root"
    lower(job_env(root), *MATMULS, umask=0)
    found = entries(root)
    assert len(found) == 5
    assert {oct(p.stat().st_mode & 0o7777) for p in found} == {"0o644"}
    assert oct((root / "jax_triton" / ".triton-keys").stat().st_mode & 0o777) == "0o700"
    assert [p.name for p in (root / "jax_triton").iterdir() if p.name.startswith(".gpu-cache-tmp")] == []
    for path in found:
        assert kernel_cache.problem_in(path.read_bytes(), path.name) is None


# --- single-flight, the node-local tier -------------------------------------------------------

#: One job: imports jax-triton, says it is ready, waits for the go file, then lowers the
#: workload's five matmuls (so that every job misses every kernel at once).
DRIVER = r'''
import os, sys, time
ready, go = sys.argv[1:3]
import jax, jax_triton
from gpu_cache.workloads import jax_triton_kernels
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.002)
sys.exit(jax_triton_kernels.main(["--shape", "256", "--mode", "lower", "--kernels", "matmul"]))
'''


def driver_commands(work: Path, tag: str, count: int) -> list[list[str]]:
    """``count`` DRIVER command lines, their ready files ``<tag><i>`` in ``work/sync``."""
    program = work / "driver.py"
    program.write_text(DRIVER)
    (work / "sync").mkdir(exist_ok=True)
    return [[sys.executable, str(program), str(work / "sync" / f"{tag}{i}"), str(work / "sync" / "go")]
            for i in range(count)]


def compiles_per_key(sections: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for section in sections:
        for miss in section["missed"]:
            counts[miss["key"]] = counts.get(miss["key"], 0) + 1
    return counts


@pytest.mark.slow
def test_processes_that_miss_together_compile_each_kernel_once(tmp_path):
    needs_jax_triton()
    root = tmp_path / "root"
    environ = job_env(root, {"single_flight": {"timeout": "5m"}})
    commands = driver_commands(tmp_path, "job", 3)
    procs = [subprocess.Popen(c, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c in commands]
    deadline = time.monotonic() + 300
    while len(list((tmp_path / "sync").iterdir())) < 3 and time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.02)
    (tmp_path / "sync" / "go").touch()
    done = [(p.wait(timeout=600), *p.communicate()) for p in procs]
    assert [code for code, _out, _err in done] == [0, 0, 0], [err[-2000:] for _c, _o, err in done]
    modules = {json.loads(out.strip().splitlines()[-1])["module_sha256"][0] for _c, out, _e in done}
    assert len(modules) == 1
    sections = records(root, "jax_triton")
    compiled = compiles_per_key(sections)
    assert len(compiled) == 5 and set(compiled.values()) == {1}, compiled
    assert sum(s["hits"] for s in sections) == 10
    flights = [s["single_flight"] for s in sections]
    assert {f["state"] for f in flights} == {"on"} and sum(f["led"] for f in flights) == 5
    assert not list((root / "locks" / "jax_triton").iterdir())


@pytest.mark.slow
def test_two_nodes_compile_each_kernel_once(sshfs_mount, tmp_path):
    """Two nodes (tests/harness/flight_nodes.py: a mount namespace and sshfs mount each, where flock
    excludes within a node only), two jobs each on an empty root: each kernel compiled once,
    through the lease of cluster single-flight."""
    from flight_nodes import Node, go, wait_ready

    needs_jax_triton()
    work = tmp_path / "work"
    work.mkdir()
    point = tmp_path / "share"
    config = {"single_flight": {"timeout": "5m"}, "local_tier": {"mode": "off"}}
    nodes = []
    try:
        for name in ("node-a", "node-b"):
            nodes.append(Node(work, sshfs_mount, name, point, driver_commands(work, name, 2),
                              plugin_environ(), root=point / "cache", config=config))
        wait_ready(work, 4, nodes)
        go(work)
        results = [node.result() for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    runs = [run for result in results for run in result["runs"]]
    assert [run["returncode"] for run in runs] == [0] * 4, [run["stderr"] for run in runs]
    sections = records(sshfs_mount.server_dir / "cache", "jax_triton")
    compiled = compiles_per_key(sections)
    assert len(compiled) == 5 and set(compiled.values()) == {1}, compiled
    assert {s["single_flight"]["mode"] for s in sections} == {"cluster"}


@pytest.mark.slow
def test_the_node_local_tier_promotes_kernels_and_a_fresh_node_fetches_them(tmp_path):
    needs_jax_triton()
    root, tiers = tmp_path / "root", tmp_path / "tiers"
    config = {"local_tier": {"mode": "on", "folder": str(tiers)}}
    environ = job_env(root, config)
    local = Path(environ["GPU_CACHE_JAX_TRITON"])
    assert local.parent == Path(environ["GPU_CACHE_TIER"]) and local != root / "jax_triton"
    lower(environ, *MATMULS)
    assert len(entries(root)) == 5  # promoted to the shared root as each was written
    assert sorted(p.name for p in local.iterdir() if not p.name.startswith(".")) == \
        [p.name for p in entries(root)]
    shutil.rmtree(tiers)  # another node: an empty local tier
    environ = job_env(root, config)
    lower(environ, *MATMULS)
    first, second = records(root, "jax_triton")
    assert (first["misses"], first["tier"]["promoted"]) == (5, 5)
    assert (second["hits"], second["misses"], second["tier"]["fetched"]) == (5, 0, 5)


# --- warm, validate, explain, stats, prune, pack ----------------------------------------------

WORKLOAD = {"default_workloads": ["jax-triton"], "workloads": {"jax-triton": {"shapes": [256]}},
            "validate": {"measure_cold": False}}


def _pass(command: str, root: Path, tmp_path: Path, **extra: str) -> dict:
    result = run_cli(command, "--config-json", json.dumps(WORKLOAD), "--cache-root", str(root),
                     "--output", str(tmp_path / f"{command}.json"), "--log", str(tmp_path / "log"),
                     env=plugin_environ(**extra))
    assert result.returncode in (0, 1), result.stderr[-3000:]
    return read_json(tmp_path / f"{command}.json")


@pytest.mark.slow
def test_warm_and_validate_prove_the_kernels_and_explain_names_what_changed(tmp_path):
    """The built-in workload lowered for sm_90 here (no GPU): warm keeps its six kernels, a
    fresh validation hits all six; with another Triton variable in the jobs it fails, and the
    cause is named."""
    needs_jax_triton()
    root = tmp_path / "root"
    warmed = _pass("warm", root, tmp_path)
    assert warmed["new_entries"]["jax_triton"] == 6
    verdict = _pass("validate", root, tmp_path)
    assert verdict["passed"] is True, verdict["problems"]
    assert verdict["jax_triton"] == {"hits": 6, "misses": 0, "new_entries": 0, "processes_observed": 1}
    verdict = _pass("validate", root, tmp_path, TRITON_DEFAULT_FP_FUSION="0")
    assert verdict["passed"] is False and verdict["jax_triton"]["misses"] == 6
    named = [p for p in verdict["problems"] if p.startswith("jax_triton: kernel")]
    assert named and all("TRITON_DEFAULT_FP_FUSION changed from None to '0'" in p for p in named), named
    assert {tuple(e["changed"]) for e in verdict["explain"]} == {("environment",)}
    report = run_cli("doctor", "--explain", "--cache-root", str(root))
    assert "jax-triton kernels compiled in the process" in report.stdout, report.stdout
    assert "environment: Triton's cache-invalidating variables differ" in report.stdout


@pytest.mark.slow
def test_stats_prune_and_pack_carry_the_kernels(warmed, tmp_path):
    root = _copy(warmed, tmp_path)
    stats = json.loads(run_cli("stats", "--json", "--cache-root", str(root)).stdout)["kinds"]["jax_triton"]
    assert stats["entries"] == 5 and {row["name"] for row in stats["by_function"]} == {"matmul_kernel"}
    archive = tmp_path / "kernels.tar.gz"
    packed = run_cli("pack", str(archive), "--cache-root", str(root), "--kind", "jax_triton", "--json")
    assert packed.returncode == 0, packed.stderr
    assert json.loads(packed.stdout)["entries"] == {"jax_triton": 5}
    other = tmp_path / "elsewhere" / "root"  # another machine's root, at another path
    unpacked = run_cli("unpack", str(archive), "--cache-root", str(other), "--json")
    assert unpacked.returncode == 0, unpacked.stderr
    assert json.loads(unpacked.stdout)["written"] == {"jax_triton": 5}
    assert {oct(p.stat().st_mode & 0o7777) for p in entries(other)} == {"0o644"}
    lower(job_env(other), *MATMULS)
    assert records(other, "jax_triton")[0]["hits"] == 5
    old = time.time() - 3 * 86400
    victims = entries(root)[:2]
    for path in victims:
        os.utime(path, (old, old))
    pruned = run_cli("prune", "--cache-root", str(root), "--max-age", "2d", "--kind", "jax_triton", "--json")
    assert pruned.returncode == 0, pruned.stderr
    removed = json.loads(pruned.stdout)["jax_triton"]["removed"]
    assert sorted(r["key"] for r in removed) == sorted(p.name for p in victims)
    assert len(entries(root)) == 3 and (root / "jax_triton" / ".triton-keys").is_dir()


@pytest.mark.slow
def test_a_read_only_kernel_folder_serves_its_kernels_and_the_job_runs_with_one_warning(warmed, tmp_path):
    """A kernel folder that cannot be written (a read-only bind mount, which binds root too):
    what it holds is loaded, what it lacks is compiled and not kept, with one warning line."""
    if os.geteuid() != 0:
        unavailable("a read-only bind mount needs root")
    root = _copy(warmed, tmp_path)
    for path in entries(root)[:2]:
        path.unlink()
    environ = job_env(root)
    folder = root / "jax_triton"
    subprocess.run(["mount", "--bind", str(folder), str(folder)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(folder)], check=True)
        _summary, done = lower(environ, *MATMULS)
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)
    (section,) = records(root, "jax_triton")
    assert (section["hits"], section["misses"]) == (3, 2)
    assert len(warnings(done)) == 1 and "write" in warnings(done)[0], done.stderr[-2000:]
    assert len(entries(root)) == 3
