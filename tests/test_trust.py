"""The trust rule and filesystem trouble, each made for real.

Who can add a file to a cache folder can run code in every job that reads it, so gpu-cache
refuses a folder that anyone but its owner (and root, and the members of ``shared_group``)
can write: world-writable (sticky bit or not), group-writable by another group, or writable
through a POSIX ACL. A cache path that cannot be used never fails a command or a job
(test_trust_faults.py): one warning line, and the kind runs without its cache (JAX) or
node-locally (the others).

Faults are real: chmod/chgrp, groupadd/useradd, ACLs written as the kernel's extended
attribute, planting as user ``nobody`` with ``runuser``, and the CLI run as another user.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from acls import GROUP, GROUP_OBJ, MASK, OTHER, USER, USER_OBJ, set_acl
from gpu_cache.config.settings import resolve_cache_root
from gpu_cache.core.errors import UsageError
from helpers import clean_environ, jax_job_env, read_json, run_cli, write_config
from other_users import NO_WORK, as_user, no_traceback, one_config, warning_lines

# Under CI (root there) a test never skips for this: it would fail instead.
pytestmark = pytest.mark.skipif(os.geteuid() != 0 and not os.environ.get("CI"),
                                reason="chown, groupadd, useradd, runuser need root")


# ---------------------------------------------------------------- world-writable


def test_a_root_owned_1777_jax_folder_is_refused(tmp_path):
    root = tmp_path / "root"
    (root / "jax").mkdir(parents=True)
    os.chmod(root / "jax", 0o1777)  # like /tmp: world-writable with the sticky bit
    result = run_cli("env", "--json", "--cache-root", str(root))
    assert result.returncode == 0, result.stderr
    exports = json.loads(result.stdout)
    why = exports["problems"]["jax"]
    assert "world-writable" in why and "sticky bit" in why
    assert f"`chmod o-w,g-w {root / 'jax'}`" in why  # 1777: group root can write too
    assert exports["exports"]["JAX_ENABLE_COMPILATION_CACHE"] == "false"
    assert "JAX_COMPILATION_CACHE_DIR" not in exports["exports"]
    assert "triton" not in exports["problems"]  # only the planted-in folder is refused
    doctor = run_cli("doctor", "--cache-root", str(root))
    assert doctor.returncode == 1 and "world-writable" in doctor.stdout
    os.chmod(root / "jax", 0o755)  # the fix the message gives, applied: trusted again
    fixed = json.loads(run_cli("env", "--json", "--cache-root", str(root)).stdout)
    assert fixed["exports"]["JAX_COMPILATION_CACHE_DIR"] == str(root / "jax")


ATTACKER = """\
import json, os
import jax, numpy as np
folder = os.environ["JAX_COMPILATION_CACHE_DIR"]
names = []
for f in (lambda x: x + 1.0, lambda x: x * 0.0 + 100.0):  # the victim's program, then the evil one
    before = set(os.listdir(folder))
    jax.jit(f)(np.ones(3, np.float32)).block_until_ready()
    (name,) = set(os.listdir(folder)) - before
    names.append(name)
print(json.dumps(names))
"""
VICTIM = """\
import sys
import jax, numpy as np
value = float(jax.jit(lambda x: x + 1.0)(np.ones(3, np.float32))[0])
open(sys.argv[1], "w").write(repr(value))
"""


@pytest.mark.slow
def test_an_entry_planted_by_another_user_in_a_1777_folder_is_never_served(base):
    """The attack end to end: nobody plants an evil executable under the victim's key in a
    root-owned 1777 jax/; plain JAX serves it (x + 1.0 gives 100.0); through gpu-cache the
    folder is refused, the job still runs and computes 2.0."""
    attacker_dir = base / "attacker"
    attacker_dir.mkdir()
    (base / "attacker.py").write_text(ATTACKER)
    found = subprocess.run([sys.executable, str(base / "attacker.py")], capture_output=True, text=True,
                           env=jax_job_env(attacker_dir, shared_fs=True), timeout=120)
    assert found.returncode == 0, found.stderr
    victim_key, evil_entry = json.loads(found.stdout)
    for path in (attacker_dir, *attacker_dir.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)
    root = base / "cache"
    (root / "jax").mkdir(parents=True)
    os.chmod(root / "jax", 0o1777)
    plant = subprocess.run(["runuser", "-u", "nobody", "--", "cp", str(attacker_dir / evil_entry),
                            str(root / "jax" / victim_key)], capture_output=True, text=True)
    assert plant.returncode == 0, plant.stderr  # the sticky bit did not stop it
    victim = base / "victim.py"
    victim.write_text(VICTIM)
    # Plain JAX on that folder (what gpu-cache exported before): the planted code runs.
    plain = subprocess.run([sys.executable, str(victim), str(base / "plain.txt")], capture_output=True,
                           text=True, env=jax_job_env(root / "jax", shared_fs=True), timeout=120)
    assert plain.returncode == 0, plain.stderr
    assert (base / "plain.txt").read_text() == "100.0"
    # Through gpu-cache: refused, and the job runs without the cache, correctly.
    config = write_config(base / "victim.yaml", {
        "workloads": {"victim": {"command": f"{{python}} '{victim}' '{base / 'warm.txt'}'"}},
        "default_workloads": ["victim"]})
    warm = run_cli("warm", "--config", str(config), "--cache-root", str(root),
                   "--output", str(base / "warm.json"), "--log", str(base / "warm.log"))
    assert warm.returncode == 0, warm.stderr
    no_traceback(warm)
    assert (base / "warm.txt").read_text() == "2.0"
    report = read_json(base / "warm.json")
    assert any(w.startswith("jax:") and "without its persistent cache" in w for w in report["problems"])
    assert any("world-writable" in p for p in report["problems"])
    assert [line for line in warning_lines(warm.stderr) if "jax" in line and "world-writable" in line]


# ---------------------------------------------------------------- group-writable


def test_a_folder_writable_by_another_group_is_refused_unless_it_is_the_shared_group(tmp_path, team_group):
    root = tmp_path / "root"
    (root / "jax").mkdir(parents=True)
    shutil.chown(root / "jax", group=team_group)
    os.chmod(root / "jax", 0o775)
    refused = json.loads(run_cli("env", "--json", "--cache-root", str(root)).stdout)
    why = refused["problems"]["jax"]
    assert f"writable by group {team_group}" in why
    assert f"`chmod g-w {root / 'jax'}`" in why and "shared_group: GROUP" in why
    assert refused["exports"]["JAX_ENABLE_COMPILATION_CACHE"] == "false"
    config = write_config(tmp_path / "c.yaml", {"shared_group": team_group})
    shared = json.loads(run_cli("env", "--json", "--config", str(config), "--cache-root",
                                str(root)).stdout)
    assert "jax" not in shared["problems"]
    assert shared["exports"]["JAX_COMPILATION_CACHE_DIR"] == str(root / "jax")
    # Group 0 is never a private group: writable by group root is refused, even in root's
    # own folder (in shared-group mode gpu-cache hands the folders it owns to the group).
    other = tmp_path / "other"
    (other / "jax").mkdir(parents=True)
    shutil.chown(other / "jax", group=0)
    os.chmod(other / "jax", 0o775)
    again = json.loads(run_cli("env", "--json", "--cache-root", str(other)).stdout)
    assert "writable by group root" in again["problems"]["jax"]
    # gpu-cache's own folders are never group-writable, even under umask 002, so it never
    # refuses what it made itself.
    fresh = subprocess.run([sys.executable, "-m", "gpu_cache", "env", "--json", "--cache-root",
                            str(tmp_path / "fresh" / "root")], capture_output=True, text=True,
                           env=clean_environ(), preexec_fn=lambda: os.umask(0o002), timeout=120)
    assert json.loads(fresh.stdout)["problems"] == {}, fresh.stdout
    assert (tmp_path / "fresh" / "root" / "jax").stat().st_mode & 0o022 == 0


def env_exports(root: Path, config: dict | None = None, folder: Path | None = None) -> dict:
    """What `gpu-cache env --json` exports and refuses for ``root`` (with ``config``)."""
    args = ["env", "--json", "--cache-root", str(root)]
    if config is not None:
        args += ["--config", str(write_config((folder or root.parent) / "gpu-cache.yaml", config))]
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    no_traceback(result)
    return json.loads(result.stdout)


def jax_cached_in(shown: dict, root: Path) -> bool:
    """Whether JAX caches in ``root`` by what env exported: its folder, or the cache off."""
    exports = shown["exports"]
    if "JAX_COMPILATION_CACHE_DIR" in exports:
        assert exports["JAX_COMPILATION_CACHE_DIR"] == str(root / "jax") and "jax" not in shown["problems"]
        return True
    assert exports["JAX_ENABLE_COMPILATION_CACHE"] == "false" and "jax" in shown["problems"]
    return False


#: Modes of a kind folder and whether JAX may cache there: only its owner (root) and, in
#: shared-group mode, that group may write. 0757 is writable by others only (group root
#: cannot), which a rule reading only the group bits would let through (#19).
MODES = [(0o757, None, False), (0o1757, None, False), (0o775, None, False), (0o770, None, False),
         (0o775, "team", True), (0o2770, "team", True), (0o757, "team", False), (0o755, None, True)]


@pytest.mark.parametrize("mode,shared,cached", MODES, ids=[f"{m:o}-{s or 'alone'}" for m, s, _ in MODES])
def test_who_may_write_a_kind_folder_decides_what_env_exports(mode, shared, cached, base, team_group):
    root = base / "cache"
    (root / "jax").mkdir(parents=True)
    shutil.chown(root / "jax", group=team_group)
    os.chmod(root / "jax", mode)
    shown = env_exports(root, {"shared_group": team_group} if shared else None, base)
    assert jax_cached_in(shown, root) is cached
    # Only the folder others can plant in is refused: Triton still caches under the root.
    assert shown["exports"]["TRITON_CACHE_DIR"] == str(root / "triton")


@pytest.mark.parametrize("folder", ["records", "locks"])
def test_a_records_or_locks_folder_others_may_write_is_refused_with_one_warning(folder, base):
    # A 0777 records folder inside a trusted root was exported without a word: whoever adds a
    # record there tells validate what the jobs compiled, and the replay what to import.
    root = base / "cache"
    (root / folder).mkdir(parents=True)
    os.chmod(root / folder, 0o777)
    shown = env_exports(root, folder=base)
    if folder == "records":
        assert not shown["exports"]["GPU_CACHE_RECORDS"].startswith(str(root))
        assert "world-writable" in shown["problems"]["records"]
    else:
        locks = shown["single_flight"]["locks"]
        assert locks is None or not locks.startswith(str(root))
    shell = run_cli("env", "--cache-root", str(root), env=clean_environ(TMPDIR=str(base)))
    assert sum(f"{root / folder} is world-writable" in line for line in shell.stderr.splitlines()) == 1
    doctor = run_cli("doctor", "--cache-root", str(root), env=clean_environ(TMPDIR=str(base)))
    assert f"{root / folder} is world-writable" in doctor.stdout
    if folder == "records":
        assert "records: PROBLEM" in doctor.stdout, doctor.stdout


def test_a_root_only_others_can_write_sends_every_kind_elsewhere(base):
    root = base / "cache"
    root.mkdir()
    os.chmod(root, 0o757)
    shown = env_exports(root, folder=base)
    assert jax_cached_in(shown, root) is False
    assert not shown["exports"]["TRITON_CACHE_DIR"].startswith(str(root))
    locks = shown["single_flight"]["locks"]
    assert locks is None or not locks.startswith(str(root))
    os.chmod(root, 0o755)
    assert jax_cached_in(env_exports(root, folder=base), root) is True


# ---------------------------------------------------------------- folders above the root (#21)

#: Modes of the folder that holds the root (root-owned) and whether the root may be used:
#: anyone who may rename the root away in it may put theirs in its place, except under the
#: sticky bit (then only the root's owner may rename it), as ssh's StrictModes judges.
PARENTS = [(0o777, None, False), (0o757, None, False), (0o775, None, False), (0o775, "team", True),
           (0o2770, "team", True), (0o1777, None, True), (0o1757, None, True), (0o1775, None, True),
           (0o755, None, True)]


@pytest.mark.parametrize("mode,shared,cached", PARENTS, ids=[f"{m:o}-{s or 'alone'}" for m, s, _ in PARENTS])
def test_who_may_write_the_folder_above_the_root_decides_what_env_exports(mode, shared, cached, base,
                                                                          team_group):
    project = base / "project"
    project.mkdir()
    shutil.chown(project, group=team_group)
    os.chmod(project, mode)
    root = project / "cache"
    shown = env_exports(root, {"shared_group": team_group} if shared else None, base)
    assert jax_cached_in(shown, root) is cached
    assert shown["exports"]["TRITON_CACHE_DIR"].startswith(str(root)) is cached
    doctor = json.loads(run_cli("doctor", "--json", "--cache-root", str(root),
                                *(["--config", str(base / "gpu-cache.yaml")] if shared else [])).stdout)
    assert doctor["ok"] is cached


def test_a_link_on_the_path_is_judged_where_it_lives_and_where_it_leads(base):
    """The root through a symbolic link: the folder holding the link and the folders above
    the link's target both decide."""
    (base / "real").mkdir()
    (base / "links").mkdir()
    (base / "links" / "project").symlink_to(base / "real")
    root = base / "links" / "project" / "cache"
    assert jax_cached_in(env_exports(root, folder=base), root) is True
    os.chmod(base / "links", 0o777)  # anyone may replace the link
    assert jax_cached_in(env_exports(root, folder=base), root) is False
    os.chmod(base / "links", 0o755)
    os.chmod(base / "real", 0o777)  # anyone may rename the root in the link's target
    assert jax_cached_in(env_exports(root, folder=base), root) is False


def test_another_user_swapping_the_root_in_a_0777_parent_is_refused_and_the_sticky_bit_stops_it(base):
    """The attack for real: the root in a 0777 project folder; user nobody renames it away and
    puts their own in its place (after env ran, the jobs would use theirs). env refuses the
    root up front; with the fix it proposes (chmod +t) the same swap fails."""
    project = base / "project"
    project.mkdir()
    os.chmod(project, 0o777)
    root = project / "cache"
    shown = env_exports(root, folder=base)
    assert jax_cached_in(shown, root) is False
    assert f"chmod +t {project}" in shown["problems"]["jax"]
    swap = ["runuser", "-u", "nobody", "--", "sh", "-c", 'mv "$1/cache" "$1/old" && mkdir "$1/cache"',
            "sh", str(project)]
    swapped = subprocess.run(swap, capture_output=True, text=True)
    assert swapped.returncode == 0, swapped.stderr  # the danger is real
    assert root.stat().st_uid == pwd.getpwnam("nobody").pw_uid
    shutil.rmtree(root)
    shutil.rmtree(project / "old")
    os.chmod(project, 0o1777)
    assert jax_cached_in(env_exports(root, folder=base), root) is True
    refused = subprocess.run(swap, capture_output=True, text=True)
    assert refused.returncode != 0 and "Operation not permitted" in refused.stderr
    assert root.stat().st_uid == os.geteuid() and (root / "jax").is_dir()
    # A root that another user made first in the sticky folder is theirs: refused.
    shutil.rmtree(root)
    subprocess.run(["runuser", "-u", "nobody", "--", "mkdir", "-m", "755", str(root)], check=True)
    assert jax_cached_in(env_exports(root, folder=base), root) is False


@pytest.mark.slow
def test_a_user_private_group_may_write_until_it_has_another_member(base, private_user):
    """With umask 002 every folder a user makes is writable by their private group: trusted,
    as long as that group is really private (here checked as the user, with runuser)."""
    home = Path(pwd.getpwnam(private_user).pw_dir)
    root = home / "cache"
    (root / "jax").mkdir(parents=True)
    for folder in (home, root, root / "jax"):
        shutil.chown(folder, user=private_user, group=private_user)
        folder.chmod(0o775)
    (base / "home").chmod(0o755)
    config = one_config(base, NO_WORK)
    alone = as_user(private_user, base, "env", "--json", "--config", str(config), "--cache-root", str(root))
    assert alone.returncode == 0, alone.stderr
    assert json.loads(alone.stdout)["exports"]["JAX_COMPILATION_CACHE_DIR"] == str(root / "jax")
    subprocess.run(["gpasswd", "-a", "nobody", private_user], check=True, capture_output=True)
    assert "nobody" in grp.getgrnam(private_user).gr_mem
    shared = as_user(private_user, base, "env", "--json", "--config", str(config), "--cache-root", str(root))
    assert shared.returncode == 0, shared.stderr
    why = json.loads(shared.stdout)["problems"]["jax"]
    # The home above the root first: any member could now swap the root (#21).
    assert f"{home}, above the cache root, is writable by group {private_user}" in why and "chmod g-w" in why
    home.chmod(0o755)
    shared = as_user(private_user, base, "env", "--json", "--config", str(config), "--cache-root", str(root))
    why = json.loads(shared.stdout)["problems"]["jax"]
    assert f"{root} is writable by group {private_user}" in why and "chmod g-w" in why


@pytest.mark.slow
def test_a_record_others_may_write_is_refused_where_your_group_is_private(base, private_user):
    """A record is judged as a file a job takes in: group-writable by the user's own private
    group is theirs (``umask 002``), writable by everyone (``0646``: not by the group) is not."""
    home = Path(pwd.getpwnam(private_user).pw_dir)
    records = home / "cache" / "records"
    records.mkdir(parents=True)
    (base / "home").chmod(0o755)
    for mode, name in ((0o664, "1-mine.json"), (0o646, "2-planted.json")):
        (records / name).write_text(json.dumps({"version": 1, "time": 1.0, "run_id": name[2:-5]}))
        (records / name).chmod(mode)
    for path in (home, home / "cache", records, *records.iterdir()):
        shutil.chown(path, user=private_user, group=private_user)
    stats = as_user(private_user, base, "stats", "--json", "--cache-root", str(home / "cache"))
    assert stats.returncode == 0, stats.stderr
    assert [run["run_id"] for run in json.loads(stats.stdout)["runs"]] == ["mine"]


# ---------------------------------------------------------------- ACLs

NO_ID = 0xFFFFFFFF


def nobody_can_add_a_file(folder: Path) -> bool:
    return subprocess.run(["runuser", "-u", "nobody", "--", "touch", str(folder / "planted")],
                          capture_output=True).returncode == 0


@pytest.mark.slow
def test_an_acl_that_lets_another_user_write_is_refused(base, team_group):
    root = base / "cache"
    jax = root / "jax"
    jax.mkdir(parents=True)
    jax.chmod(0o755)
    nobody = pwd.getpwnam("nobody").pw_uid
    team = grp.getgrnam(team_group).gr_gid

    def env_json(*extra: str) -> dict:
        result = run_cli("env", "--json", *extra, "--cache-root", str(root))
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    set_acl(jax, (USER_OBJ, 7, NO_ID), (USER, 7, nobody), (GROUP_OBJ, 5, NO_ID), (MASK, 7, NO_ID),
            (OTHER, 5, NO_ID))
    assert nobody_can_add_a_file(jax)  # the fault is real: the mode alone (775) would say "group"
    why = env_json()["problems"]["jax"]
    assert "ACL" in why and "user nobody" in why and f"`setfacl -b {jax}`" in why
    # The same entry masked to r-x grants no write: trusted.
    (jax / "planted").unlink()
    set_acl(jax, (USER_OBJ, 7, NO_ID), (USER, 7, nobody), (GROUP_OBJ, 5, NO_ID), (MASK, 5, NO_ID),
            (OTHER, 5, NO_ID))
    assert not nobody_can_add_a_file(jax)
    assert "jax" not in env_json()["problems"]
    # A named group with write: refused, unless it is the shared_group.
    set_acl(jax, (USER_OBJ, 7, NO_ID), (GROUP_OBJ, 5, NO_ID), (GROUP, 7, team), (MASK, 7, NO_ID),
            (OTHER, 5, NO_ID))
    assert f"group {team_group}" in env_json()["problems"]["jax"]
    # (last: shared-group mode hands the root, which is ours, to the group)
    config = write_config(base / "c.yaml", {"shared_group": team_group})
    assert "jax" not in env_json("--config", str(config))["problems"]


def test_a_default_acl_that_lets_another_user_write_inside_is_refused(tmp_path):
    """A default ACL hands write to nobody in every folder JAX or Triton creates inside
    (a Triton key folder, say), so it is refused like an access ACL."""
    jax = tmp_path / "cache" / "jax"
    jax.mkdir(parents=True)
    nobody = pwd.getpwnam("nobody").pw_uid
    set_acl(jax, (USER_OBJ, 7, NO_ID), (USER, 7, nobody), (GROUP_OBJ, 5, NO_ID), (MASK, 7, NO_ID),
            (OTHER, 5, NO_ID), default=True)
    (jax / "key-folder").mkdir()
    assert os.getxattr(jax / "key-folder", "system.posix_acl_access")  # inherited for real
    result = run_cli("env", "--json", "--cache-root", str(tmp_path / "cache"))
    why = json.loads(result.stdout)["problems"]["jax"]
    assert "default ACL" in why and "user nobody" in why and f"`setfacl -k {jax}`" in why


# ---------------------------------------------------------------- ~user


def test_tilde_user_is_that_users_home(tmp_path, private_user):
    home = Path(pwd.getpwnam(private_user).pw_dir)
    environ = {"HOME": str(tmp_path / "my-home")}
    assert resolve_cache_root(f"~{private_user}/cache", environ) == home / "cache"
    assert resolve_cache_root("~nobody/cache", environ) == Path(pwd.getpwnam("nobody").pw_dir) / "cache"
    assert resolve_cache_root("~/cache", environ) == tmp_path / "my-home" / "cache"  # $HOME for ~
    assert resolve_cache_root("~", environ) == tmp_path / "my-home"
    with pytest.raises(UsageError, match="no user 'no-such-user-xyz'"):
        resolve_cache_root("~no-such-user-xyz/cache", environ)
    result = run_cli("env", "--json", "--cache-root", f"~{private_user}/cache",
                     env=clean_environ(HOME=str(tmp_path / "my-home")))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["exports"]["GPU_CACHE_ROOT"] == str(home / "cache")
    bad = run_cli("env", "--cache-root", "~no-such-user-xyz/cache")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "no user" in bad.stderr
