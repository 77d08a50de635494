"""The stats hook in real processes: records, no cost without jax/triton, the user's own
sitecustomize, never breaking a job, the rule of a Snakemake job, and last use for prune."""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from acls import GROUP, MASK, USER, set_acl
from gpu_cache.core import software
from gpu_cache.jobenv import trust
from helpers import (
    HOOK,
    REPO,
    SCRIPTS,
    clean_environ,
    hook_piece,
    jax_job_env,
    run_cli,
    run_snakemake,
    unavailable,
)
from hook_jobs import (
    FAKE_PROGRAM,
    PLANTS,
    REFUSED,
    fake_jax,
    plant_node_local,
    records_of,
    same_as_without_the_hook,
    tree,
    warnings_in,
)

JAX_PROGRAM = "import jax, jax.numpy as jnp; print(jax.jit(lambda x: jnp.cos(x) * 3)(jnp.ones(3)))"


def hook_env(cache_root: Path, *more_path: str, **extra: str) -> dict[str, str]:
    return jax_job_env(cache_root / "jax", records=cache_root / "records", extra_path=more_path, **extra)


def python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
def test_a_jax_process_writes_one_record_with_hits_misses_and_key_parts(cache_root):
    env = hook_env(cache_root, GPU_CACHE_RULE="predict", GPU_CACHE_GPU_TYPE="cpu")
    assert python(JAX_PROGRAM, env).returncode == 0
    assert python(JAX_PROGRAM, env).returncode == 0
    cold, warm = records_of(cache_root)
    assert cold["rule"] == "predict" and cold["gpu_type"] == "cpu" and cold["host"]
    assert cold["device"] == {"platform": "cpu", "kinds": ["cpu"], "count": 1}
    assert cold["jax"]["misses"] >= 1 and cold["jax"]["hits"] == 0
    assert any(m["name"] == "jit__lambda" for m in cold["jax"]["missed"])
    assert warm["jax"]["misses"] == 0 and warm["jax"]["hits"] == cold["jax"]["misses"]
    assert isinstance(warm["jax"]["saved_seconds"], float)  # tiny programs: may be < 0
    parts = next(v for k, v in warm["jax"]["key_parts"].items() if k.startswith("jit__lambda-"))
    assert {"computation", "XLA flags", "compile_options", "accelerator_config", "compression"} <= set(parts)
    # The software of every piece's distributions, not only those it imported (jax's): what warm
    # and validate keep of this interpreter, to which stats and explain compare a job's record.
    assert cold["software"] == warm["software"] == software.identity(env)


def test_no_record_and_no_heavy_imports_in_a_process_without_jax_or_triton(cache_root):
    # What matters, whatever this Python's site loads (.pth files differ between machines, and
    # Debian's Python imports a sitecustomize of its own): no jax, no triton, no record, and a
    # bound on what the hook adds. That it ran: its mark on sys.
    code = ("import sys, json; "
            "print(json.dumps([hasattr(sys, '_gpu_cache_startup_hook'), sorted(sys.modules)]))")
    plain = set(json.loads(python(code, clean_environ(PYTHONPATH="")).stdout)[1])
    hooked = python(code, hook_env(cache_root))
    assert hooked.returncode == 0 and hooked.stderr == ""
    ran, loaded = json.loads(hooked.stdout)
    added = set(loaded) - plain
    assert not {name for name in added if name.split(".")[0] in ("jax", "jaxlib", "triton", "torch")}
    assert ran and len(added) <= 10, sorted(added)
    assert not (cache_root / "records").exists()


@pytest.mark.slow
def test_the_users_own_sitecustomize_still_runs(cache_root, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = 'yes'\n")
    env = hook_env(cache_root, str(mine))
    done = python("import os; " + JAX_PROGRAM + "; print(os.environ.get('USER_SITE_RAN'))", env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("yes")
    assert len(records_of(cache_root)) == 1  # and the hook still recorded


@pytest.mark.slow
def test_a_broken_hook_never_breaks_the_job(cache_root, tmp_path):
    # The records folder is a file: writing the record fails; the job still succeeds.
    (cache_root).mkdir(parents=True)
    (cache_root / "records").write_text("not a folder")
    done = python(JAX_PROGRAM, hook_env(cache_root))
    assert done.returncode == 0
    warnings = [line for line in done.stderr.splitlines() if line.startswith("gpu-cache: warning")]
    assert len(warnings) == 1 and "writing the record" in warnings[0]


@pytest.mark.slow
def test_a_snakemake_job_is_recorded_with_its_rule_and_wildcards(cache_root, tmp_path):
    # Snakemake exports no rule name to jobs; a job run in a process of its own (SLURM's job
    # script and srun step, any remote executor) is run by `snakemake --target-jobs R:W`.
    work = tmp_path / "wf"
    work.mkdir()
    (work / "Snakefile").write_text(
        "rule predict:\n"
        "    output: 'out/{sample}.txt'\n"
        f"    shell: '{sys.executable} -c \"{JAX_PROGRAM}\" > {{output}}'\n")
    env = hook_env(cache_root)
    done = run_snakemake(work, "--cores", "1", "--target-jobs", "predict:sample=a", env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    (record,) = records_of(cache_root)
    assert record["rule"] == "predict" and record["wildcards"] == "sample=a"


@pytest.mark.slow
def test_a_hit_entry_survives_an_age_prune_and_a_never_hit_one_goes(cache_root):
    env = hook_env(cache_root)
    assert python(JAX_PROGRAM, env).returncode == 0
    entries = sorted((cache_root / "jax").glob("*-cache"))
    assert entries
    old = time.time() - 40 * 86400
    for entry in entries:
        os.utime(entry, (old, old))
    # A computation that is never used again, equally old.
    stale = cache_root / "jax" / f"jit_unused-{'0' * 64}-cache"
    stale.write_bytes(b"x" * 10)
    os.utime(stale, (old, old))
    assert python(JAX_PROGRAM, env).returncode == 0  # hits every entry: the hook bumps mtimes
    result = run_cli("prune", "--max-age", "30d", "--json", "--cache-root", str(cache_root),
                     env=clean_environ())
    assert result.returncode == 0, result.stderr
    assert not stale.exists()
    assert all(entry.exists() for entry in entries)
    assert json.loads(result.stdout)["jax"]["entries_removed"] == 1


# --- Several copies of the hook, and faults that must never break the job (issue 11) -------

#: The hook's modules every process loads at start (its package, the leaf, the start's checks),
#: and those a process that imports jax loads besides (the JAX piece).
AT_START = ['gpu_cache_hook', 'gpu_cache_hook.names', 'gpu_cache_hook.start']
JAX_PIECES = sorted([*AT_START, 'gpu_cache_hook.common', 'gpu_cache_hook.kinds', 'gpu_cache_hook.kinds.jax'])
#: The hook as it was before it marked itself (commit bd030ffd), as a job may still carry it.
OLD_HOOK = REPO / "tests" / "fixtures" / "hook-before-marker"
#: The hook as one file, before it was split into pieces (commit 49c8287): it has the marker.
WHOLE_HOOK = REPO / "tests" / "fixtures" / "hook-before-split"
#: A user's sitecustomize that counts its runs in $RUNS_FILE.
COUNTING_SITE = "import os\nwith open(os.environ['RUNS_FILE'], 'a') as f:\n    f.write('ran\\n')\n"


def user_site(tmp_path: Path, text: str = COUNTING_SITE) -> Path:
    folder = tmp_path / "mine"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(text)
    return folder


def hook_copy(tmp_path: Path, how: str) -> Path:
    """Another copy of the hook folder: this checkout through a symlink, a second checkout,
    the last hook version before the marker, or the last one in one file."""
    if how == "symlink":
        (tmp_path / "other-checkout").symlink_to(REPO, target_is_directory=True)
        return tmp_path / "other-checkout" / HOOK.relative_to(REPO)
    folder = tmp_path / f"{how}-hook"
    if how == "copy":
        shutil.copytree(HOOK, folder, ignore=shutil.ignore_patterns("__pycache__"))
        return folder
    return {"old": OLD_HOOK, "whole": WHOLE_HOOK}[how]


@contextlib.contextmanager
def mounted(*command: str, target: Path):
    """``mount COMMAND... TARGET`` for the block (root only: skip elsewhere); unmounted after."""
    made = subprocess.run(["mount", *command, str(target)], capture_output=True, text=True)
    if made.returncode != 0:
        unavailable(f"cannot mount here: {made.stderr.strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["symlink", "copy"])
def test_two_copies_of_the_hook_act_as_one_in_a_real_jax_job(cache_root, tmp_path, how):
    # The profile from one checkout and the workflow from another (or the same checkout
    # through a symlink): before, every Python job died with RecursionError in find_spec.
    runs = tmp_path / "runs"
    env = hook_env(cache_root, str(hook_copy(tmp_path, how)), str(user_site(tmp_path)),
                   RUNS_FILE=str(runs))
    done = python(JAX_PROGRAM, env)
    assert done.returncode == 0 and "RecursionError" not in done.stderr, done.stderr[-3000:]
    assert done.stderr == "" and done.stdout.startswith("[1.62")
    (record,) = records_of(cache_root)
    assert record["jax"]["misses"] >= 1
    assert runs.read_text() == "ran\n"  # the user's own sitecustomize: exactly once
    plain = python("print('plain')", env)  # a process without jax: silent, no record
    assert (plain.returncode, plain.stdout, plain.stderr) == (0, "plain\n", "")
    assert runs.read_text() == "ran\nran\n" and len(records_of(cache_root)) == 1


@pytest.mark.parametrize("order", ["old after ours", "old before ours", "three copies",
                                   "one-file after ours", "one-file before ours"])
def test_an_older_copy_of_the_hook_never_recurses(cache_root, tmp_path, order):
    old, fake, mine = hook_copy(tmp_path, "old"), fake_jax(tmp_path), user_site(tmp_path)
    whole = hook_copy(tmp_path, "whole")
    runs = tmp_path / "runs"
    hooks = {"old after ours": [HOOK, old], "old before ours": [old, HOOK],
             "three copies": [HOOK, old, hook_copy(tmp_path, "copy")],
             "one-file after ours": [HOOK, whole, old], "one-file before ours": [whole, HOOK]}[order]
    env = clean_environ(GPU_CACHE_RECORDS=str(cache_root / "records"), RUNS_FILE=str(runs),
                        PYTHONPATH=os.pathsep.join(map(str, [*hooks, mine, fake, SCRIPTS])))
    done = python(FAKE_PROGRAM, env)
    assert (done.returncode, done.stdout, done.stderr) == (3, "the job ran\n", "")
    assert runs.read_text() == "ran\n"
    (record,) = records_of(cache_root)  # one watcher: the first copy's (the old one's, if first)
    assert record["jax"]["requests"] == 3
    pieces = python("import sys, jax; print(sorted(m for m in sys.modules if m.startswith('gpu_cache_')))",
                    env).stdout
    # ours loads its pieces where it runs first; run by the old hook (which sets no mark) as the
    # user's, it starts, and leaves the watching and the record to the old one's
    assert pieces == f"{ {HOOK: JAX_PIECES, old: AT_START, whole: []}[hooks[0]] }\n"


def test_a_process_loads_a_piece_of_the_hook_only_for_what_it_imports(cache_root, tmp_path):
    # The record's piece is loaded at exit, from the hook's own folder: a job that took the
    # hook off sys.path, or has a module of the same name, still gets its record.
    fake, shadow = fake_jax(tmp_path), tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "gpu_cache_hook").mkdir()
    for name in ("__init__.py", "records.py"):
        (shadow / "gpu_cache_hook" / name).write_text("raise RuntimeError('not the hook')\n")
    env = hook_env(cache_root, str(fake))
    code = ("import sys; before = sorted(m for m in sys.modules if m.startswith('gpu_cache'))\n"
            "import jax\n"
            "print(before, sorted(m for m in sys.modules if m.startswith('gpu_cache')))\n"
            f"sys.path[:] = [{str(shadow)!r}] + [p for p in sys.path if 'hook' not in p]\n"
            "jax.compile_many(2)\n")
    done = python(code, env)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"{AT_START} {JAX_PIECES}\n"
    (record,) = records_of(cache_root)
    assert record["jax"]["requests"] == 2 and record["libraries"] == ["jax"]


def test_a_users_sitecustomize_that_raises_is_reported_as_python_does(cache_root, tmp_path):
    fake = fake_jax(tmp_path)
    mine = user_site(tmp_path, "raise ValueError('the user broke it')\n")
    env = hook_env(cache_root, str(mine), str(fake))
    bare = clean_environ(PYTHONPATH=os.pathsep.join([str(mine), str(fake), str(SCRIPTS)]))
    plain, done = (python(FAKE_PROGRAM, e) for e in (bare, env))
    assert (done.returncode, done.stdout, done.stderr) == (plain.returncode, plain.stdout, plain.stderr)
    assert "ValueError: the user broke it" in done.stderr and done.stdout == "the job ran\n"
    assert len(records_of(cache_root)) == 1
    # One that calls sys.exit stops the interpreter's start, with or without the hook.
    (mine / "sitecustomize.py").write_text("import sys\nsys.exit(4)\n")
    plain, done = (python(FAKE_PROGRAM, e) for e in (bare, env))
    assert (done.returncode, done.stdout) == (plain.returncode, plain.stdout) == (1, "")
    assert done.stderr.splitlines()[-1] == plain.stderr.splitlines()[-1] == "SystemExit: 4"


def test_a_records_folder_that_links_outside_the_root_is_refused(cache_root, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    cache_root.mkdir()
    (cache_root / "records").symlink_to(outside, target_is_directory=True)
    fake = fake_jax(tmp_path)
    done = same_as_without_the_hook(FAKE_PROGRAM, hook_env(cache_root, str(fake)), fake)
    assert "symbolic link" in warnings_in(done.stderr)[0]
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("acl", ["user nobody rwx", "user nobody r-x"])
def test_a_team_records_folder_an_acl_lets_another_account_write_gets_no_record(cache_root, tmp_path,
                                                                                team_group, acl):
    """A team's records folder (``2770``, the team's group) with an ACL entry that lets user
    nobody, no member, write it too (the mode shows only the mask): the job runs as without the
    hook, writes no record there, and says why; an entry that only reads is no reason. Guard: the
    hook's owner rule reads the ACL where the mode lets a group write (``owners.acl_problem``;
    without it the record was written)."""
    need_root()
    records = cache_root / "records"
    records.mkdir(parents=True)
    os.chown(records, -1, grp.getgrnam(team_group).gr_gid)
    records.chmod(0o2770)
    undefined = 0xFFFFFFFF
    set_acl(records, (0x01, RWX, undefined), (USER, RWX if "rwx" in acl else R_X, NOBODY),
            (0x04, RWX, undefined), (MASK, RWX, undefined), (0x20, 0, undefined))
    fake = fake_jax(tmp_path)
    done = same_as_without_the_hook(FAKE_PROGRAM, hook_env(cache_root, str(fake)), fake)
    written = list(records.glob("*.json"))
    if acl.endswith("r-x"):
        assert len(written) == 1 and not warnings_in(done.stderr)
        return
    assert written == [] and f"writable by user {NOBODY} through an ACL" in warnings_in(done.stderr)[0]


@pytest.mark.parametrize("fault", ["a file", "a FIFO", "a dangling symlink", "read-only", "full"])
def test_a_records_folder_that_cannot_take_the_record_never_changes_the_job(cache_root, tmp_path, fault):
    fake, records = fake_jax(tmp_path), cache_root / "records"
    records.parent.mkdir(parents=True)
    env = hook_env(cache_root, str(fake))
    with contextlib.ExitStack() as stack:
        if fault == "a file":
            records.write_text("not a folder")
        elif fault == "a FIFO":
            os.mkfifo(records)
        elif fault == "a dangling symlink":
            records.symlink_to(tmp_path / "nowhere")
        elif fault == "read-only":
            records.mkdir()
            stack.enter_context(mounted("--bind", str(records), target=records))
            subprocess.run(["mount", "-o", "remount,ro,bind", str(records)], check=True)
        else:  # a 200 KiB tmpfs, filled up
            records.mkdir()
            stack.enter_context(mounted("-t", "tmpfs", "-o", "size=200k", "tmpfs", target=records))
            with contextlib.suppress(OSError), open(records / "filler", "wb") as stream:
                while True:
                    stream.write(b"x" * 4096)
                    stream.flush()
        done = same_as_without_the_hook(FAKE_PROGRAM, env, fake)
        assert len(warnings_in(done.stderr)) == 1 and "writing the record" in done.stderr
        if records.is_dir():  # nothing left behind, not even a half-written temporary file
            assert sorted(p.name for p in records.iterdir()) == (["filler"] if fault == "full" else [])


@pytest.mark.parametrize("value", ["", "records"])
def test_gpu_cache_records_empty_or_relative_writes_nothing(tmp_path, value):
    fake, work = fake_jax(tmp_path), tmp_path / "work"
    work.mkdir()
    env = clean_environ(GPU_CACHE_RECORDS=value,
                        PYTHONPATH=os.pathsep.join(map(str, [HOOK, fake, SCRIPTS])))
    done = same_as_without_the_hook(FAKE_PROGRAM, env, fake, cwd=work)
    assert list(work.iterdir()) == []  # a relative folder would land in every job's cwd
    assert ("absolute" in done.stderr) == bool(value)


@pytest.mark.parametrize("fault", ["sys.argv missing", "sys.stderr None", "sys.stderr closed",
                                   "jax internals differ"])
def test_an_odd_process_still_gets_its_record_and_its_own_output(cache_root, tmp_path, fault):
    code = {"sys.argv missing": "import sys; del sys.argv; ",  # as in an embedded interpreter
            "sys.stderr None": "import sys; sys.stderr = None; ",
            "sys.stderr closed": "import sys; sys.stderr.close(); ",
            "jax internals differ": ""}[fault] + FAKE_PROGRAM
    replace = {"_src/cache_key.py": "", "_src/compiler.py": "from jax import monitoring\n"
               "def compile(name, hit):\n"
               "    monitoring.record_event('/jax/compilation_cache/compile_requests_use_cache')\n"}
    fake = fake_jax(tmp_path, **(replace if fault == "jax internals differ" else {}))
    done = same_as_without_the_hook(code, hook_env(cache_root, str(fake)), fake)
    (record,) = records_of(cache_root)
    assert record["jax"]["requests"] == 3
    assert record["argv"] == ([] if fault == "sys.argv missing" else ["-c"])
    if fault == "jax internals differ":  # counts still, names and key parts lost, one warning
        assert record["jax"]["missed"] == [] and len(warnings_in(done.stderr)) == 1
    else:
        assert len(record["jax"]["missed"]) == 3 and done.stderr == ""


def test_an_unreadable_proc_leaves_the_record_without_a_rule(cache_root, tmp_path):
    fake = fake_jax(tmp_path)
    env = hook_env(cache_root, str(fake))
    script = f"mount -t tmpfs none /proc && exec {sys.executable} -c \"{FAKE_PROGRAM}\""
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                          env=env, capture_output=True, text=True, timeout=60)
    if "unshare failed" in done.stderr or "mount:" in done.stderr:
        unavailable(f"no private mount namespace here: {done.stderr.strip()}")
    assert (done.returncode, done.stdout, done.stderr) == (3, "the job ran\n", "")
    (record,) = records_of(cache_root)
    assert record["rule"] is None and record["jax"]["requests"] == 3


def test_a_record_stays_small_whatever_the_number_of_compiles(cache_root, tmp_path):
    program = ("import jax; jax.compile_many(3000); jax.compile_many(2500, hit=True, prefix='g'); "
               "print('the job ran')")
    fake = fake_jax(tmp_path)
    done = same_as_without_the_hook(program, hook_env(cache_root, str(fake)), fake)
    assert done.stderr == ""
    (path,) = (cache_root / "records").glob("*.json")
    (record,) = records_of(cache_root)
    jax_part = record["jax"]
    assert (jax_part["requests"], jax_part["hits"], jax_part["misses"]) == (5500, 2500, 3000)
    assert len(jax_part["missed"]) == len(jax_part["hit_keys"]) == len(jax_part["key_parts"]) == 1000
    assert jax_part["dropped"] == {"missed": 2000, "hit_keys": 1500, "key_parts": 4500}
    assert path.stat().st_size < 400_000


# --- Folders the hook falls back to, and bytecode of two images (issue 21) -----------------


#: test_trust's fixtures: a folder other users can reach, a user with a user-private group.


def need_root() -> None:
    if os.geteuid() != 0:
        unavailable("needs root (chown, runuser, mount)")


RWX, R_X = 0o7, 0o5
NOBODY = pwd.getpwnam("nobody").pw_uid
#: Folders made for real, each as (mode, owner, ACL entries, default ACL entries).
FOLDERS = {
    "0700": (0o700, 0, [], []), "0755": (0o755, 0, [], []), "0775 group root": (0o775, 0, [], []),
    "0757 others only": (0o757, 0, [], []), "0777": (0o777, 0, [], []), "1777": (0o1777, 0, [], []),
    "0755 of nobody": (0o755, NOBODY, [], []), "0700 of nobody": (0o700, NOBODY, [], []),
    "ACL user nobody": (0o755, 0, [(USER, RWX, NOBODY), (MASK, RWX, 0xFFFFFFFF)], []),
    "ACL user nobody masked": (0o755, 0, [(USER, RWX, NOBODY), (MASK, R_X, 0xFFFFFFFF)], []),
    "ACL group nogroup": (0o755, 0, [(GROUP, RWX, NOBODY), (MASK, RWX, 0xFFFFFFFF)], []),
    "default ACL user nobody": (0o755, 0, [], [(USER, RWX, NOBODY), (MASK, RWX, 0xFFFFFFFF)]),
}


#: Folders above a cache folder (each holds one of root's, 0755), as (mode, owner).
ABOVE = {"above 0777": (0o777, 0), "above 1777": (0o1777, 0), "above 0775 group root": (0o775, 0),
         "above 0755 of nobody": (0o755, NOBODY), "above 1777 of nobody": (0o1777, NOBODY),
         "above 0755": (0o755, 0)}


def test_the_hooks_trust_rule_agrees_with_gpu_cache_env(base, private_user):
    need_root()
    hook = hook_piece("trust")
    verdicts = {}
    for name, (mode, owner, acl, default) in FOLDERS.items():
        folder = base / name.replace(" ", "-")
        folder.mkdir()
        os.chown(folder, owner, -1)
        folder.chmod(mode)
        for entries, is_default in ((acl, False), (default, True)):
            if entries:
                base_entries = [(0x01, RWX, 0xFFFFFFFF), (0x04, R_X, 0xFFFFFFFF), (0x20, R_X, 0xFFFFFFFF)]
                set_acl(folder, *sorted([*base_entries, *entries]), default=is_default)
        verdicts[name] = folder
    for name, (mode, owner) in ABOVE.items():
        above = base / name.replace(" ", "-")
        (above / "cache").mkdir(parents=True)
        os.chown(above, owner, -1)
        above.chmod(mode)
        verdicts[name] = above / "cache"
    verdicts = {name: (trust.distrust(folder, None, trusted_above=folder) is None,
                       hook.distrust(str(folder)) is None) for name, folder in verdicts.items()}
    assert all(a == b for a, b in verdicts.values()), verdicts
    assert [name for name, (ok, _) in verdicts.items() if ok] == [
        "0700", "0755", "ACL user nobody masked", "above 1777", "above 0755"]
    # The user-private group (the only group that may write a user's own cache), and after it
    # gets a second member.
    user = pwd.getpwnam(private_user)
    pairs = [(user.pw_uid, user.pw_gid), (user.pw_uid, 0), (0, 0), (NOBODY, user.pw_gid)]
    assert [hook.private_group(*p) for p in pairs] == [trust.private_group(*p) for p in pairs] \
        == [True, False, False, False]
    subprocess.run(["gpasswd", "-a", "nobody", private_user], check=True, capture_output=True)
    trust.private_group.cache_clear()
    mine = (user.pw_uid, user.pw_gid)
    assert hook.private_group(*mine) is trust.private_group(*mine) is False


@pytest.mark.slow
@pytest.mark.parametrize("plant", PLANTS)
@pytest.mark.parametrize("how", ["cannot create its folder", "exported node-local"])
def test_a_triton_fallback_another_user_made_first_is_never_used(base, plant, how):
    # A job whose TRITON_CACHE_DIR cannot be created (a root not bound into a container) falls
    # back to $TMPDIR/gpu-cache-<uid>/triton, which gpu-cache env also exports on a node for a
    # read-only root; there another user made that folder first, with a file in it. The job
    # compiles into a private folder instead, and says why.
    need_root()
    tmp, planted = plant_node_local(base, plant, "triton")
    before = tree(planted)
    records = base / "records"
    wanted = "/proc/gpu-cache-not-bound/triton" if how.startswith("cannot") else str(planted / "triton")
    environ = clean_environ(TRITON_CACHE_DIR=wanted, TRITON_HOME=str(base), TMPDIR=str(tmp),
                            GPU_CACHE_RECORDS=str(records),
                            PYTHONPATH=os.pathsep.join([str(HOOK), str(SCRIPTS)]))
    done = subprocess.run([sys.executable, "-m", "gpu_cache.workloads.triton_kernels", "--shape", "64",
                           "--mode", "aot"], env=environ, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (warning,) = warnings_in(done.stderr)
    assert "refused" in warning and "private folder" in warning
    assert tree(planted) == before  # nothing read from it, nothing written into it
    (record,) = [json.loads(p.read_text()) for p in records.glob("*.json")]
    fallback = record["fallbacks"]["triton"]
    assert REFUSED[plant] in fallback["refused"] and fallback["wanted"] == wanted
    assert record["triton"]["misses"] == 5  # compiled in its private folder
    private = Path(fallback["used"]).parent  # the process's private folder, removed at exit
    assert private.parent == tmp and private.name.startswith("gpu-cache-") and not private.exists()


@pytest.mark.parametrize("plant", PLANTS)
def test_a_lock_folder_another_user_made_first_turns_single_flight_off(base, tmp_path, plant):
    # Whoever can add files to the lock folder can hold the locks a job waits on.
    need_root()
    tmp, planted = plant_node_local(base, plant.replace("triton", "locks"), "locks")
    before = tree(planted)
    fake = fake_jax(tmp_path)
    environ = clean_environ(GPU_CACHE_LOCKS=str(planted / "locks"), TMPDIR=str(tmp),
                            GPU_CACHE_RECORDS=str(base / "records"),
                            PYTHONPATH=os.pathsep.join([str(HOOK), str(fake), str(SCRIPTS)]))
    done = same_as_without_the_hook(FAKE_PROGRAM, environ, fake)
    (warning,) = warnings_in(done.stderr)
    assert "lock folder is refused" in warning and "without single-flight" in warning
    assert tree(planted) == before
    (record,) = [json.loads(p.read_text()) for p in (base / "records").glob("*.json")]
    assert REFUSED[plant] in record["jax"]["single_flight"]["state"]
    assert str(planted) in record["fallbacks"]["locks"]["refused"]


def make_image(folder: Path, value: int) -> Path:
    """An "image": a Python environment (a venv) whose site-packages holds mymod.py with X =
    value, at a fixed mtime and size, as images built with normalised mtimes have it."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    (site,) = folder.glob("lib/python*/site-packages")
    source = site / "mymod.py"
    source.write_text(f"X = {value}\n")
    for path in (source, site):
        os.utime(path, (1_000_000_000, 1_000_000_000))
    return folder


def test_two_images_with_one_module_path_size_and_mtime_never_run_each_others_bytecode(tmp_path):
    # Two images (no APPTAINER_CONTAINER: Docker, Podman, enroot) mounted in turn at one path,
    # each with mymod.py at the same path, size and mtime but another content.
    need_root()
    images = {name: make_image(tmp_path / f"image-{name}", value) for name, value in (("a", 1), ("b", 2))}
    mount_point = tmp_path / "opt" / "venv"
    mount_point.mkdir(parents=True)
    environ = clean_environ(GPU_CACHE_BYTECODE=str(tmp_path / "root" / "bytecode"),
                            PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=str(HOOK))
    code = "import mymod; print(mymod.X, mymod.__cached__)"
    seen = []
    for name in ("a", "b", "a", "a", "b"):
        with mounted("--bind", str(images[name]), target=mount_point):
            done = subprocess.run([str(mount_point / "bin" / "python"), "-c", code], env=environ,
                                  capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and done.stderr == "", done.stderr
        value, cached = done.stdout.split()
        seen.append((name, value, cached, Path(cached).stat().st_mtime_ns))
    assert [value for _, value, _, _ in seen] == ["1", "2", "1", "1", "2"]  # never the other image's
    folders = {name: Path(cached).parent for name, _, cached, _ in seen}
    assert folders["a"] != folders["b"]  # a bytecode folder per image
    assert seen[2][2:] == seen[3][2:] == seen[0][2:]  # and each image's bytecode is read back, not rewritten


def test_a_changed_module_outside_the_image_folders_never_runs_its_old_bytecode(tmp_path):
    # An application's own code (not in site-packages: e.g. /app), changed at the same size and
    # mtime: the .pyc holds the source's hash, checked at each import.
    need_root()
    apps = {}
    for name, value in (("a", 1), ("b", 2)):
        apps[name] = tmp_path / f"app-{name}"
        apps[name].mkdir()
        (apps[name] / "mymod.py").write_text(f"X = {value}\n")
        os.utime(apps[name] / "mymod.py", (1_000_000_000, 1_000_000_000))
    mount_point = tmp_path / "app"
    mount_point.mkdir()
    environ = clean_environ(GPU_CACHE_BYTECODE=str(tmp_path / "root" / "bytecode"),
                            PYTHONDONTWRITEBYTECODE="1",
                            PYTHONPATH=os.pathsep.join([str(HOOK), str(mount_point)]))
    values = []
    for name in ("a", "b", "a"):
        with mounted("--bind", str(apps[name]), target=mount_point):
            done = python("import mymod; print(mymod.X)", environ)
        assert done.returncode == 0 and done.stderr == "", done.stderr
        values.append(done.stdout.strip())
    assert values == ["1", "2", "1"]
