"""The container test harness is real: the root built by .ci/build-roots.sh runs another Python and
another jax than the host's, only bound host paths exist in it, Snakemake's ``--sdm apptainer`` runs
jobs in it through the stand-in tests/bin/apptainer, and JAX there writes and hits a bound cache.

These tests check the infrastructure that issue 12's tests build on, not gpu-cache itself.
"""

from __future__ import annotations

import json
import platform
import textwrap
import zlib
from importlib.metadata import version
from pathlib import Path

import pytest

from helpers import run_snakemake

#: Prints what a job sees, as JSON; stdlib + jax only (runs under the root's Python 3.9).
PROBE = textwrap.dedent("""\
    import json, os, sys
    import jax
    paths = sys.argv[2:]
    json.dump({
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "jax": jax.__version__,
        "env": {k: os.environ.get(k) for k in (
            "JAX_COMPILATION_CACHE_DIR", "PATH", "HOME", "LD_LIBRARY_PATH", "APPTAINER_CONTAINER",
            "APPTAINER_BINDPATH", "PYTHONDONTWRITEBYTECODE", "GPU_CACHE_HARNESS_PROBE")},
        "cwd": os.getcwd(),
        "exists": {p: os.path.exists(p) for p in paths},
    }, open(sys.argv[1], "w"))
""")


def test_exec_runs_the_roots_own_python_and_jax(container_root, tmp_path):
    result = container_root.exec(
        "python3", "-c", "import sys, jax; print(sys.version.split()[0], jax.__version__, sys.executable)",
        cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    python, jax_version, executable = result.stdout.split()
    assert python.startswith("3.9.") and jax_version == "0.4.30", result.stdout
    assert (python, jax_version) == (container_root.python_version, container_root.jax_version)
    assert executable == "/usr/bin/python3"
    # really other software than the host's
    assert python.rsplit(".", 1)[0] != platform.python_version().rsplit(".", 1)[0]
    assert jax_version != version("jax")  # the host's, read without importing jax


def test_only_bound_host_paths_are_visible(container_root, unbound_dir, tmp_path):
    dirs = {name: unbound_dir / name for name in ("bindpath", "bind", "singularity", "flag")}
    for name, folder in dirs.items():
        folder.mkdir()
        (folder / "marker").write_text(name)
    script = 'for p in "$@"; do if [ -e "$p" ]; then echo "$p yes"; else echo "$p no"; fi; done'

    # Nothing bound: the folder is not there; the root itself is read-only.
    result = container_root.exec(
        "sh", "-c", script + '; touch /usr/written-by-a-job 2>&1 || true', "sh",
        str(dirs["bindpath"] / "marker"), str(unbound_dir),
        options=["--home", tmp_path], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"{dirs['bindpath'] / 'marker'} no" in result.stdout
    assert f"{unbound_dir} no" in result.stdout
    assert "Read-only file system" in result.stdout
    assert not Path("/usr/written-by-a-job").exists()

    # The bind variables and -B add up (dst and :ro honoured); SINGULARITY_BINDPATH is ignored
    # while APPTAINER_BINDPATH is set, as Apptainer does.
    env = container_root.environ(
        APPTAINER_BINDPATH=str(dirs["bindpath"]),
        APPTAINER_BIND=f"{dirs['bind']}:/srv/elsewhere/bind",
        SINGULARITY_BINDPATH=str(dirs["singularity"]))
    result = container_root.exec(
        "sh", "-c", script + f'; echo written > {dirs["bindpath"]}/from-job; '
        'touch /data/flag/x 2>&1 || true', "sh",
        str(dirs["bindpath"] / "marker"), "/srv/elsewhere/bind/marker",
        str(dirs["singularity"] / "marker"), "/data/flag/marker", str(dirs["bind"]),
        env=env, binds=[f"{dirs['flag']}:/data/flag:ro"], options=["--home", tmp_path], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = set(result.stdout.splitlines())
    assert {f"{dirs['bindpath'] / 'marker'} yes", "/srv/elsewhere/bind/marker yes",
            f"{dirs['singularity'] / 'marker'} no", "/data/flag/marker yes",
            f"{dirs['bind']} no"} <= lines, result.stdout
    assert (dirs["bindpath"] / "from-job").read_text() == "written\n"  # bound read-write
    assert "Read-only file system" in result.stdout  # :ro

    # Without APPTAINER_BINDPATH, SINGULARITY_BINDPATH counts.
    env = container_root.environ(SINGULARITY_BINDPATH=str(dirs["singularity"]))
    result = container_root.exec("cat", str(dirs["singularity"] / "marker"), env=env, cwd=tmp_path)
    assert (result.returncode, result.stdout) == (0, "singularity"), result.stderr

    # A bind whose source does not exist is fatal, as in Apptainer.
    result = container_root.exec("true", binds=[unbound_dir / "missing"], cwd=tmp_path)
    assert result.returncode == 255 and "doesn't exist" in result.stderr


def test_snakemake_sdm_apptainer_runs_the_job_in_the_root(container_root, unbound_dir, tmp_path):
    workdir = tmp_path / "wf"
    workdir.mkdir()
    (workdir / "probe.py").write_text(PROBE)
    cache = unbound_dir / "jax"
    cache.mkdir()
    (workdir / "Snakefile").write_text(textwrap.dedent(f"""\
        rule probe:
            output: "probe.json"
            container: "{container_root.image}"
            shell: "python3 probe.py {{output}} {cache} {unbound_dir / 'not-bound'}"
        """))
    (unbound_dir / "not-bound").mkdir()
    log = tmp_path / "apptainer.jsonl"
    env = container_root.environ(
        JAX_COMPILATION_CACHE_DIR=str(cache), APPTAINER_BINDPATH=str(cache),
        GPU_CACHE_HARNESS_PROBE="from the host", GPU_CACHE_TEST_APPTAINER_LOG=str(log))
    result = run_snakemake(workdir, "--sdm", "apptainer", "--cores", "1", env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    probe = json.loads((workdir / "probe.json").read_text())
    assert probe["python"].startswith("3.9.") and probe["jax"] == "0.4.30", probe
    assert probe["executable"] == "/usr/bin/python3"
    # The host environment reaches the job, PATH is the image's, HOME is Snakemake's --home.
    assert probe["env"]["JAX_COMPILATION_CACHE_DIR"] == str(cache)
    assert probe["env"]["GPU_CACHE_HARNESS_PROBE"] == "from the host"
    assert probe["env"]["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert probe["env"]["HOME"] == str(workdir) == probe["cwd"]
    assert probe["env"]["APPTAINER_BINDPATH"] is None  # Apptainer does not forward its own variables
    assert probe["env"]["PYTHONDONTWRITEBYTECODE"] == "1"  # the image's ENV default
    assert probe["env"]["APPTAINER_CONTAINER"].endswith(".simg")
    # Bound: the cache folder; not bound: its siblings.
    assert probe["exists"] == {str(cache): True, str(unbound_dir / "not-bound"): False}
    # It went through the stand-in, with Snakemake's own command line.
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) == 1
    argv = calls[0]["argv"]
    assert argv[:4] == ["apptainer", "exec", "--home", str(workdir)], argv
    assert (workdir / ".snakemake" / "singularity").is_dir()


def test_jax_in_the_root_writes_and_hits_a_bound_cache(container_root, unbound_dir, tmp_path):
    code = textwrap.dedent("""\
        import collections, jax, jax.numpy as jnp
        events = collections.Counter()
        jax.monitoring.register_event_listener(lambda event, **kw: events.update([event]))
        jax.jit(lambda x: jnp.sin(x) * 2)(jnp.arange(4.0)).block_until_ready()
        print(events["/jax/compilation_cache/compile_requests_use_cache"],
              events["/jax/compilation_cache/cache_hits"])
        """)
    env = container_root.environ(
        APPTAINER_BINDPATH=f"{unbound_dir}:/jax-cache", JAX_COMPILATION_CACHE_DIR="/jax-cache",
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PLATFORMS="cpu")
    cold = container_root.exec("python3", "-c", code, env=env, cwd=tmp_path)
    assert cold.returncode == 0, cold.stderr
    requests, hits = map(int, cold.stdout.split())
    assert requests > 0 and hits == 0, cold.stdout
    entries = sorted(p for p in unbound_dir.iterdir() if p.is_file())
    # jax 0.4.30 names entries <module>-<sha256> (no -cache/-atime suffix) ...
    assert any(p.name.startswith("jit__lambda_-") for p in entries), entries
    assert not any(p.name.endswith(("-cache", "-atime")) for p in entries), entries
    # ... and, without zstandard in the root, compresses them with zlib.
    for entry in entries:
        zlib.decompress(entry.read_bytes())

    warm = container_root.exec("python3", "-c", code, env=env, cwd=tmp_path)
    assert warm.returncode == 0, warm.stderr
    assert warm.stdout.split() == [str(requests), str(requests)], warm.stdout
    assert sorted(p for p in unbound_dir.iterdir() if p.is_file()) == entries


@pytest.mark.parametrize("argv, message", [
    (["exec", "--writable-tmpfs", "docker://gpu-cache-test/x", "true"], "not supported"),
    (["exec", "--no-such-flag", "docker://gpu-cache-test/x", "true"], "unknown flag"),
    (["exec", "docker://kosinskilab/alphafold3:2.5", "true"], "only knows"),
    (["exec", "docker://gpu-cache-test/not-built", "true"], "not built"),
])
def test_the_stand_in_refuses_what_it_cannot_do(container_root, tmp_path, argv, message):
    import subprocess

    import containers
    result = subprocess.run([str(containers.APPTAINER), *argv], env=container_root.environ(),
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 255 and message in result.stderr, result.stderr
