"""gpu-cache's own state cannot be used against its user (issue 46): the outputs proof's
references, the verification records and the set-aside lists are read only where an entry
would be read (yours or root's, or the team's; writable by nobody else), and made with safe
modes whatever the umask. Real second users (useradd, their names carrying the pid), real
files they wrote, real processes."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from acls import GROUP_OBJ, MASK, OTHER, USER, USER_OBJ, set_acl
from gpu_cache.commands.prune import prune
from gpu_cache.config.settings import settings_from
from gpu_cache.core import verified
from gpu_cache.core.kinds import jax_format
from helpers import clean_environ, jax_job_env, read_json, run_cli, write_config
from wrong_entries import PLUS_ONE

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="useradd, chown and runuser need root")


def as_other(user: str, *command: str) -> None:
    """Run ``command`` as the other account ``user``; it must succeed."""
    done = subprocess.run(["runuser", "-u", user, "--", *command], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def give(path: Path, user: str) -> None:
    """``path`` and everything under it now belong to ``user`` (as a root left by another account)."""
    for item in (path, *path.rglob("*")):
        shutil.chown(item, user=user, group=user)


def let_write(user: str, root: Path, files: list[Path]) -> None:
    """A POSIX ACL on each of ``files`` that lets ``user`` write it, and on each folder from
    ``root`` down to them one that lets it pass (``--x``); their modes stay as they were."""
    uid, no_id = pwd.getpwnam(user).pw_uid, 0xFFFFFFFF
    for path in [root, *{f for p in files for f in p.parents if root in f.parents}, *files]:
        mode = path.stat().st_mode
        owner, group, other = (mode >> 6) & 7, (mode >> 3) & 7, mode & 7
        set_acl(path, (USER_OBJ, owner, no_id), (USER, 6 if path in files else 1, uid),
                (GROUP_OBJ, group, no_id), (MASK, group, no_id), (OTHER, other, no_id))


def plus_one(base: Path, work: Path, **config: object) -> tuple[str, ...]:
    """The CLI arguments of a user workload computing ``jit(plus_one)`` over a cache root under
    ``base`` (a folder another account can reach), with ``config``'s keys beside it."""
    (work / "plus_one.py").write_text(PLUS_ONE)
    config_file = write_config(work / "c.yaml", {
        "workloads": {"plus": {"command": f"{{python}} {work}/plus_one.py {work}/{{shape}}.npy",
                               "shapes": [3], "outputs": f"{work}/{{shape}}.npy"}},
        "default_workloads": ["plus"], **config})
    return "--config", str(config_file), "--cache-root", str(base / "root"), "--log", str(work / "log")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["left to it", "an ACL in a team's root"])
def test_a_reference_another_account_rewrote_fails_no_verdict_and_sets_nothing_aside(
        base, private_user, team_group, tmp_path, how):
    """The state folder left to another account, which rewrites the reference; or, in a team's
    root (``shared_group``), an ACL on the reference's files that lets an account outside the
    team write them, which their team mode does not show. Validation proves nothing against it,
    passes on the cache's own checks, sets nothing aside and says why. Guards: the state
    folder's trust rule (``state_files``); for the ACL, ``owners.written_by_others``'s read of
    it (without: the rewritten reference failed the verdict, "outputs differ")."""
    acl = how.startswith("an ACL")
    common = plus_one(base, tmp_path, **({"shared_group": team_group} if acl else {}))
    root = base / "root"
    assert run_cli("warm", *common, "--output", str(tmp_path / "w.json")).returncode == 0
    assert run_cli("validate", *common, "--output", str(tmp_path / "v1.json")).returncode == 0
    assert read_json(tmp_path / "v1.json")["outputs"]["shapes"][0]["outcome"] == "identical"
    entries = sorted(p.name for p in (root / "jax").iterdir())

    # The other account rewrites the reference: its outputs and its manifest, the digest made
    # anew for them.
    (reference,) = [p for p in (root / "state").rglob("*.npy")
                    if not p.name.endswith((".again.npy", ".cold.npy"))]
    manifest = reference.with_suffix(".json")
    if acl:
        let_write(private_user, root, [reference, manifest])
    else:
        give(root / "state", private_user)
    import numpy as np

    from gpu_cache.core import outputs

    np.save(base / "seven.npy", np.float32([7, 7, 7]))
    seven = outputs.digest(outputs.load(str(base / "seven.npy"))[1])
    (base / "seven.json").write_text(json.dumps({**json.loads(manifest.read_text()), "digest": seven}))
    for name, target in (("seven.npy", reference), ("seven.json", manifest)):
        (base / name).chmod(0o644)
        as_other(private_user, "cp", str(base / name), str(target))
        assert target.read_bytes() == (base / name).read_bytes()  # (in place, through the ACL)
        assert target.stat().st_uid == (0 if acl else pwd.getpwnam(private_user).pw_uid)

    done = run_cli("validate", *common, "--output", str(tmp_path / "v2.json"))
    verdict = read_json(tmp_path / "v2.json")
    assert done.returncode == 0 and verdict["passed"] is True, verdict["problems"]
    (shape,) = verdict["outputs"]["shapes"]
    assert shape["outcome"] == "not proven" and "not trusted" in shape["why"], shape
    assert "set_aside" not in verdict["outputs"]
    assert sorted(p.name for p in (root / "jax").iterdir()) == entries  # nothing set aside
    warnings = [line for line in done.stderr.splitlines() if "outputs proof" in line]
    why = (f"is writable by user {pwd.getpwnam(private_user).pw_uid} through an ACL" if acl
           else f"{root / 'state'} is owned by uid ")
    assert len(warnings) == 1 and why in warnings[0], done.stderr


@pytest.mark.slow
def test_nothing_is_kept_in_a_state_folder_another_account_owns(base, private_user, tmp_path):
    """The root's state folder is another account's (made first, or left over): a warm and a
    validation still pass, and gpu-cache keeps nothing there (no reference, no marker of the
    passed verdict, no measurement), since that account could rewrite whatever it kept and so
    steer the next runs. Guard: state_files.make's trust check."""
    common = plus_one(base, tmp_path)
    state = base / "root" / "state"
    state.mkdir(parents=True)
    give(state, private_user)
    assert run_cli("warm", *common, "--output", str(tmp_path / "w.json")).returncode == 0
    done = run_cli("validate", *common, "--output", str(tmp_path / "v.json"))
    assert done.returncode == 0 and read_json(tmp_path / "v.json")["passed"] is True, done.stderr[-3000:]
    assert list(state.iterdir()) == []


#: ``jit(plus_one)`` over ones of the shape given (its outputs file is the first argument).
PLUS_ONE_SHAPED = PLUS_ONE.replace("jnp.ones(3, ", "jnp.ones(int(sys.argv[2]), ")
#: Another function of plus_one's signature at shape 3 whose executable computes NaN.
NAN = ("import jax, jax.numpy as jnp\n"
       "def not_a_number(x):\n"
       "    return x * jnp.nan\n"
       "print(jax.jit(not_a_number)(jnp.ones(3, jnp.float32)))\n")


def cli_under_umask_000(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpu_cache", *args], env=clean_environ(),
                          capture_output=True, text=True, umask=0, timeout=600)


def writable_by_others(top: Path) -> list[str]:
    return [f"{p} {stat.filemode(p.lstat().st_mode)}" for p in [top, *top.rglob("*")]
            if not p.is_symlink() and p.lstat().st_mode & 0o022]


@pytest.mark.slow
def test_nan_from_the_cache_fails_sets_aside_that_shapes_entries_alone_and_the_state_is_safe_under_umask_000(
        tmp_path):
    """Two shapes; another function's executable that computes NaN is planted under shape 3's key.
    The verdict fails on NaN, names and sets aside shape 3's entry only (shape 4's stays and is
    served), and what gpu-cache kept in its state folder under umask 000 is writable by no one else."""
    root = tmp_path / "root"
    (tmp_path / "plus.py").write_text(PLUS_ONE_SHAPED)
    config = write_config(tmp_path / "c.yaml", {
        "workloads": {"plus": {"command": f"{{python}} {tmp_path}/plus.py {tmp_path}/{{shape}}.npy {{shape}}",
                               "shapes": [3, 4], "outputs": f"{tmp_path}/{{shape}}.npy"}},
        "default_workloads": ["plus"], "local_tier": {"mode": "off"}})
    common = ("--config", str(config), "--cache-root", str(root), "--log", str(tmp_path / "log"))
    assert cli_under_umask_000("warm", *common, "--output", str(tmp_path / "w.json")).returncode == 0
    assert cli_under_umask_000("validate", *common, "--output", str(tmp_path / "v1.json")).returncode == 0
    served = {s["shape"]: s["served"]["jax"] for s in read_json(tmp_path / "v1.json")["outputs"]["shapes"]}
    (three,), (four,) = ([k for k in served[n] if k.startswith("jit_plus_one-")] for n in (3, 4))
    only_four = set(served[4]) - set(served[3])
    assert four in only_four

    scratch = tmp_path / "scratch"
    subprocess.run([sys.executable, "-c", NAN], env=jax_job_env(scratch), check=True, capture_output=True,
                   timeout=600)
    (wrong,) = scratch.glob("jit_not_a_number-*-cache")
    shutil.copyfile(wrong, root / "jax" / f"{three}-cache")

    done = cli_under_umask_000("validate", *common, "--output", str(tmp_path / "v2.json"))
    verdict = read_json(tmp_path / "v2.json")
    assert done.returncode == 0 and verdict["passed"] is False
    outcomes = {s["shape"]: s["outcome"] for s in verdict["outputs"]["shapes"]}
    assert outcomes[3].startswith("NaN where") and outcomes[4] == "identical", outcomes
    (problem,) = [p for p in verdict["problems"] if p.startswith("NaN where")]
    assert "shape 3" in problem and f"jax {three}" in problem and four not in problem, problem
    assert verdict["outputs"]["set_aside"] == {"jax": sorted(served[3])}
    assert not (root / "jax" / f"{three}-cache").exists()
    assert all((root / "jax" / f"{key}-cache").exists() for key in only_four)
    assert writable_by_others(root / "state") == []


def fill(folder: Path, n: int) -> None:
    program = ("import jax, jax.numpy as jnp, numpy as np\n"
               f"for i in range({n}):\n"
               "    jax.jit(lambda x, i=i: jnp.sin(x) * (i + 1))(np.ones(8, np.float32))\n")
    subprocess.run([sys.executable, "-c", program], env=jax_job_env(folder, shared_fs=True), check=True,
                   capture_output=True, timeout=600)


@pytest.mark.slow
def test_prune_ignores_a_verified_record_another_account_left_and_removes_no_whole_entry(base, private_user):
    """A record calling every entry damaged, written by another account (as the startup hook's
    seal reader already ignores it): prune verifies the entries itself, removes none, and
    replaces the record with its own."""
    root = base / "root"
    folder = root / "jax"
    fill(folder, 20)
    old = time.time() - 3600  # settled: sealed by the first prune
    for path in folder.iterdir():
        os.utime(path, (old, old))
    settings = settings_from({}, cache_root=str(root))
    assert prune(settings, max_size=1 << 40, max_age=1e9, dry_run=False).kinds["jax"].entries_removed == 0
    record = verified.Record.load(folder)
    assert len(record.known) >= 20

    theirs = base / "theirs"  # the other account writes its record where it may, then it is left here
    theirs.mkdir()
    shutil.chown(theirs, user=private_user, group=private_user)
    made = base / "made"
    made.mkdir()
    planted = verified.Record(made)
    for key in record.known:
        planted.put(key, verified.DAMAGED)
    assert planted.save()
    (made / verified.NAME).chmod(0o644)
    as_other(private_user, "cp", str(made / verified.NAME), str(theirs / verified.NAME))
    os.replace(theirs / verified.NAME, folder / verified.NAME)  # left in the kind folder
    assert (folder / verified.NAME).stat().st_uid == pwd.getpwnam(private_user).pw_uid

    report = prune(settings, max_size=1 << 40, max_age=1e9, dry_run=False).kinds["jax"]
    assert report.entries_removed == 0 and report.entries_before == 20, report.removed
    assert len(jax_format.scan(folder)) == 20
    assert (folder / verified.NAME).stat().st_uid == 0  # prune's own record replaced it


@pytest.mark.slow
def test_a_warm_on_another_accounts_state_folder_sets_nothing_aside(base, private_user, tmp_path):
    """Entries no warm compiled are re-made only where their reference can then be kept: with
    the state folder another account's, setting them aside would only make every job compile
    them, warm after warm."""
    common = plus_one(base, tmp_path)
    root = base / "root"
    assert run_cli("validate", *common, "--output", str(tmp_path / "v.json")).returncode == 0  # compiles
    entries = {p.name: p.read_bytes() for p in (root / "jax").iterdir()}
    give(root / "state", private_user)
    assert run_cli("warm", *common, "--output", str(tmp_path / "w.json")).returncode == 0
    assert {p.name: p.read_bytes() for p in (root / "jax").iterdir()} == entries  # nothing set aside
    warm = read_json(tmp_path / "w.json")
    assert warm["remade"] == {}, warm["remade"]
    reference = warm["runs"][0]["outputs"]["reference"]
    assert reference["kept"] is False, reference
    assert "they could not be compiled again: no reference can be kept in this cache root" in reference["why"]
