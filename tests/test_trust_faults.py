"""Filesystem trouble, made for real (the trust rule is in test_trust.py): a cache path that
cannot be used (inside another user's 0700 folder, a 300-byte name, a file on the path, a root
others may write) never fails a command or a job: one warning line, exit 0 where the command
can go on, and stats, env and a dry run give doctor's reason; a root whose name is not UTF-8
works and prints its bytes."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, clean_environ, run_cli, run_snakemake
from other_users import NO_WORK, as_user, no_traceback, one_config, warning_lines

# Under CI (root there) a test never skips for this: it would fail instead.
pytestmark = pytest.mark.skipif(os.geteuid() != 0 and not os.environ.get("CI"),
                                reason="chown, groupadd, useradd, runuser need root")

# ---------------------------------------------------------------- filesystem trouble

#: Each fault: (how to make the root from ``base``, run as nobody?, what the one line says).
FAULTS = {
    "inside another user's 0700 folder": "permission denied",
    "a 300-byte folder name": "too long",
    "a file on the path": "is a file, not a folder",
}


def make_fault(base: Path, fault: str) -> Path:
    if fault == "inside another user's 0700 folder":
        private = base / "private"
        private.mkdir(mode=0o700)  # root's, and the CLI runs as nobody
        return private / "cache"
    if fault == "a 300-byte folder name":
        return base / ("x" * 300) / "cache"
    blocker = base / "a-file"
    blocker.write_text("not a folder")
    return blocker / "cache"


COMMANDS = (("env",), ("env", "--json"), ("doctor", "--no-fail"), ("warm",), ("validate",))
EXPORT = ("-c", "import sys; from gpu_cache.config import settings; from gpu_cache.jobenv import env; "
                "env.export(settings.settings_from({'default_workloads': []}, cache_root=sys.argv[1]))")


@pytest.mark.slow
@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_root_that_cannot_be_used_is_one_line_and_exit_0(base, fault):
    """env, env --json, doctor --no-fail, warm, validate and the workflow's parse-time export
    (env.export): exit 0, no traceback, one warning line that says why and what to do;
    JAX runs without its cache, the others node-locally."""
    root = make_fault(base, fault)
    config = one_config(base, NO_WORK)
    as_nobody = fault == "inside another user's 0700 folder"

    def run(*args: str, module: tuple[str, ...] = ("-m", "gpu_cache")) -> subprocess.CompletedProcess[str]:
        if as_nobody:
            return as_user("nobody", base, *args, module=module)
        environ = clean_environ(TMPDIR=str(base))
        return subprocess.run([sys.executable, *module, *args], capture_output=True, text=True,
                              env=environ, cwd=base, timeout=300)

    for command in COMMANDS:
        result = run(*command, "--config", str(config), "--cache-root", str(root))
        assert result.returncode == 0, (command, result.stderr)
        no_traceback(result)
        lines = warning_lines(result.stderr)
        if command != ("env", "--json") and command[0] != "doctor":
            assert len(lines) == 1, (command, result.stderr)
            assert FAULTS[fault] in lines[0] and "choose a" in lines[0]
            assert "jax runs without its persistent cache" in lines[0] and "node-local" in lines[0]
        if command == ("env", "--json"):
            exports = json.loads(result.stdout)["exports"]
            assert exports["JAX_ENABLE_COMPILATION_CACHE"] == "false"
            assert not exports["TRITON_CACHE_DIR"].startswith(str(root))
            user = "nobody" if as_nobody else "root"
            assert exports["TRITON_CACHE_DIR"].startswith(str(base)), exports  # TMPDIR's node-local
            assert f"gpu-cache-{pwd.getpwnam(user).pw_uid}" in exports["TRITON_CACHE_DIR"]
        if command[0] == "doctor":
            assert FAULTS[fault] in result.stdout and "result: some caches cannot be used" in result.stdout
    exported = run(str(root), module=EXPORT)
    assert exported.returncode == 0, exported.stderr
    no_traceback(exported)
    assert len(warning_lines(exported.stderr)) == 1 and FAULTS[fault] in exported.stderr


#: Roots that cannot be used although each is (or would be) a folder, made from ``base``.
UNUSABLE = ("world-writable", "under another account's folder", "a file")


def unusable_root(base: Path, fault: str) -> Path:
    if fault == "world-writable":
        (base / "open").mkdir(mode=0o777)
        (base / "open").chmod(0o777)
        return base / "open"
    if fault == "a file":
        (base / "a-file").write_text("not a cache")
        return base / "a-file"
    theirs = base / "theirs"
    theirs.mkdir()
    shutil.chown(theirs, user="nobody")
    return theirs / "cache"


@pytest.mark.slow
@pytest.mark.parametrize("fault", UNUSABLE)
def test_stats_env_and_a_dry_run_give_doctors_reason_for_an_unusable_root(base, fault):
    """A root no job may use: doctor's reason is what ``stats`` reports (its JSON, and a line; a
    file stops it with that reason, exit 2), what ``env`` warns, and what ``snakemake -n`` warns
    before any job, creating nothing. Before, stats said nothing (or its own words) and a dry
    run nothing at all. Guards: fs.root_check, the one place that words it, called by stats
    (cache_stats, require_folder_or_missing) and by the workflow's dry run (env.root_lines)."""
    root = unusable_root(base, fault)
    doctor = run_cli("doctor", "--json", "--no-fail", "--cache-root", str(root))
    reason = json.loads(doctor.stdout)["kinds"]["jax"]["problem"]
    assert reason and str(root) in reason, doctor.stdout
    stats = run_cli("stats", "--json", "--cache-root", str(root))
    if fault == "a file":
        assert stats.returncode == 2
        assert stats.stderr == f"gpu-cache: error: cache root cannot be used: {reason}\n"
    else:
        assert stats.returncode == 0 and json.loads(stats.stdout)["problem"] == reason, stats.stderr
        text = run_cli("stats", "--cache-root", str(root)).stdout
        assert f"  PROBLEM: {reason} (jobs do not use it" in text, text
    env = run_cli("env", "--json", "--cache-root", str(root))
    assert json.loads(env.stdout)["problems"]["jax"].startswith(f"{reason}; jax runs without")
    work, tmp = base / "work", base / "tmp"  # (Snakemake keeps its own files in work)
    work.mkdir()
    tmp.mkdir()

    def made() -> list[Path]:
        return sorted(p for p in base.rglob("*") if work not in p.parents)

    before = made()
    dry = run_snakemake(work, "--snakefile", str(REPO / "workflow" / "Snakefile"), "-n", "--config",
                        f"cache_root={root}", env=clean_environ(TMPDIR=str(tmp)))
    assert dry.returncode == 0, dry.stderr[-3000:]
    (line,) = [line for line in dry.stderr.splitlines() if line.startswith("gpu-cache: warning:")]
    assert line.startswith(f"gpu-cache: warning: jax: {reason}; jax runs without its persistent cache; ")
    assert made() == before  # a dry run makes nothing (no root, no fallback)


@pytest.mark.slow
def test_a_root_whose_name_is_not_utf8_works_and_prints_its_bytes(base):
    """Linux names are bytes: a root that is not valid UTF-8 is used as is, and `env` prints
    its exact bytes even where stdout is strict UTF-8 (a UTF-8 locale; PYTHONIOENCODING)."""
    root_bytes = os.fsencode(base) + b"/caf\xe9-\xff/cache"
    root = os.fsdecode(root_bytes)
    environ = clean_environ(PYTHONIOENCODING="utf-8", TMPDIR=str(base))
    config = one_config(base, NO_WORK)
    for command in COMMANDS:
        result = subprocess.run([sys.executable, "-m", "gpu_cache", *command, "--config", str(config),
                                 "--cache-root", root], capture_output=True, env=environ, timeout=300)
        assert result.returncode == 0, (command, result.stderr)
        assert b"Traceback" not in result.stderr and not warning_lines(os.fsdecode(result.stderr))
    shown = subprocess.run(["sh", "-c", 'eval "$("$@")" && printf %s "$JAX_COMPILATION_CACHE_DIR"', "sh",
                            sys.executable, "-m", "gpu_cache", "env", "--config", str(config),
                            "--cache-root", root], capture_output=True, env=environ, timeout=300)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == root_bytes + b"/jax"
    assert os.path.isdir(root_bytes + b"/jax")
