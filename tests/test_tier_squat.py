"""A node-local tier squatted by another user on a node where ``gpu-cache env`` did not run.

The usual case on a cluster: env runs where Snakemake runs, and the profile (or SLURM's
``--export=ALL``) carries its exports to the GPU node. There, ``/tmp/gpu-cache-<uid>/tier/...``
may have been made first by another user: their folders, links to them, 0777 folders, planted
entries. Each "node" here is a real mount namespace with its own ``/tmp`` (a tmpfs), the
squatter is the real user ``nobody``, and the job is a real JAX process under the startup hook
with the exports env gave on the host. Refused means untouched: nothing is read from the
squatted tier (a planted executable never runs) and nothing in it, or behind its links, is
written or deleted (the exit trim once deleted a folder of the victim's through a link).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_cache.core.kinds import tier_name as tier_digest
from helpers import SCRIPTS, clean_environ, run_cli, unavailable, write_config

pytestmark = pytest.mark.slow

UID = os.getuid()

#: The victim's program: one jit, printed.
VICTIM = "import jax, jax.numpy as jnp; print(float(jax.jit(lambda x: x + 1.0)(jnp.float32(1.0))))"
#: Another function of the same signature: its executable, planted under the victim's key.
ATTACKER = "import jax, jax.numpy as jnp; print(float(jax.jit(lambda x: x * 0 + 100.0)(jnp.float32(1.0))))"


@pytest.fixture
def base() -> Iterator[Path]:
    """Outside /tmp (each node hides it behind its own tmpfs), reachable by nobody."""
    if os.geteuid() != 0:
        unavailable("needs root (mount namespaces, runuser, chown)")
    path = Path(tempfile.mkdtemp(prefix="gpu-cache-squat-", dir="/var/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def exports_from_env(base: Path, max_size: str = "20G") -> tuple[dict[str, str], Path]:
    """What ``gpu-cache env`` exports on the host for a root with the tier on, and the tier."""
    root = base / "root"
    config = write_config(base / "config.yaml", {"local_tier": {"mode": "on", "max_size": max_size}})
    shown = run_cli("env", "--json", "--config", str(config), "--cache-root", str(root))
    assert shown.returncode == 0, shown.stderr
    exports = json.loads(shown.stdout)["exports"]
    tier = Path(exports["GPU_CACHE_TIER"])
    assert tier == Path("/tmp") / f"gpu-cache-{UID}" / "tier" / tier_digest(root)
    return exports, tier


def on_node(base: Path, script: str, environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``script`` (sh) on a node of its own: a private mount namespace with a fresh /tmp."""
    (base / "node.sh").write_text("mount -t tmpfs -o mode=1777 tmpfs /tmp\n" + script)
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-e", str(base / "node.sh")],
                          env=environ, capture_output=True, text=True, timeout=300)


def read(path: Path) -> str:
    return path.read_text()[-3000:] if path.exists() else ""


def victim_ran(base: Path, script: str, environ: dict[str, str]) -> None:
    """``script`` ran on a node of its own, and the victim's program in it printed its result."""
    done = on_node(base, script, environ)
    assert done.returncode == 0, done.stderr[-3000:] + read(base / "err")
    assert (base / "out").read_text().strip() == "2.0"


def job_environ(base: Path, exports: dict[str, str]) -> dict[str, str]:
    environ = clean_environ(JAX_PLATFORMS="cpu", TMPDIR="/tmp", **exports)
    environ["PYTHONPATH"] = exports["PYTHONPATH"]
    return environ


def listing(folder: str) -> str:
    """A shell line that prints every path under ``folder`` with its owner, mode, size, mtime
    and content digest (what must not change)."""
    mine = f"-name gpu-cache-{UID}-private-* -prune -o"  # the job's own private folder
    return (f"find {folder} -mindepth 1 {mine} -printf '%p %u %m %s %T@\\n' | sort; "
            f"find {folder} -mindepth 1 {mine} -type f -exec sha256sum {{}} + | sort")


def plant(tier: Path, how: str) -> str:
    """Shell lines, run as root on the node before the job, that squat ``tier`` as user nobody."""
    top = tier.parents[1]  # /tmp/gpu-cache-<uid>
    nobody = "runuser -u nobody --"
    if how == "nobody's folders":
        return f"{nobody} mkdir -p -m 0755 {tier}/jax\n"
    if how == "nobody's 0777 folders":
        return f"{nobody} sh -c 'umask 000 && mkdir -p {tier}/jax {tier}/triton'\n"
    if how == "a link to nobody's folder":
        return (f"{nobody} mkdir -p /tmp/theirs/tier/{tier.name}/jax\n"
                f"{nobody} ln -s /tmp/theirs {top}\n")
    if how == "ours, 0777, with nobody's tier":
        return (f"mkdir -m 0777 {top}\n"
                f"{nobody} sh -c 'umask 000 && mkdir -p {tier}/jax'\n")
    raise AssertionError(how)


HOW = ["nobody's folders", "nobody's 0777 folders", "a link to nobody's folder",
       "ours, 0777, with nobody's tier"]


@pytest.mark.parametrize("how", HOW)
def test_a_squatted_tier_runs_no_planted_executable_and_is_left_untouched(base, how):
    exports, tier = exports_from_env(base)
    environ = job_environ(base, exports)
    # The squatter's executable of another function, under the key of the victim's: compiled on
    # the node at the tier's path (jax 0.10 keys hold it), the entries swapped, handed to nobody.
    scratch = f"/tmp/scratch-{os.getpid()}"
    plain = f"env -u GPU_CACHE_TIER PYTHONPATH={SCRIPTS} JAX_COMPILATION_CACHE_DIR={scratch}"
    script = (f"mkdir -p {scratch}/victim {scratch}/attacker\n"
              f"{plain}/victim {sys.executable} -c '{VICTIM}' >/dev/null\n"
              f"{plain}/attacker {sys.executable} -c '{ATTACKER}' >/dev/null\n"
              + plant(tier, how) +
              f"real=$(readlink -f {tier}/jax)\n"
              f"victim=$(ls {scratch}/victim | grep '^jit__lambda.*-cache$')\n"
              f"theirs=$(ls {scratch}/attacker | grep '^jit__lambda.*-cache$')\n"
              f"cp {scratch}/attacker/$theirs \"$real/$victim\"\n"
              f"chown -R nobody \"$real\"\n"
              f"rm -rf {scratch}\n"
              f"({listing('/tmp')}) > {base}/before\n"
              f"{sys.executable} -c '{VICTIM}' > {base}/out 2> {base}/err\n"
              f"({listing('/tmp')}) > {base}/after\n")
    done = on_node(base, script, environ)
    assert done.returncode == 0, done.stderr[-3000:] + read(base / "err")
    assert (base / "out").read_text().strip() == "2.0"  # the job's own function, never the planted one
    assert (base / "before").read_text() == (base / "after").read_text(), "the job touched the squatted tier"
    warnings = [line for line in (base / "err").read_text().splitlines() if line.startswith("gpu-cache:")]
    assert len(warnings) == 1 and "node-local tier" in warnings[0] and "refused" in warnings[0], warnings


def test_the_trim_of_a_squatted_tier_deletes_nothing_behind_its_links(base):
    exports, tier = exports_from_env(base, max_size="1M")
    environ = job_environ(base, exports)
    victims = base / "victims files"
    victims.mkdir()
    for i in range(5):
        (victims / f"thesis-{i}.tex").write_text("years of work\n")
        os.utime(victims / f"thesis-{i}.tex", (1e9, 1e9))  # last touched long ago
    # A link to the victim's folder where an entry tree goes, and a 1 TiB sparse file dated a year
    # ahead, so the tier is over its bound and "in use" forever.
    top = tier.parents[1]
    script = (f"runuser -u nobody -- sh -c 'umask 000 && mkdir -p {tier}/jax && truncate -s 1T "
              f"{tier}/jax/big-{'0' * 64}-cache && touch -d \"+1 year\" {tier}/jax/big-{'0' * 64}-cache'\n"
              f"ln -s '{victims}' {tier}/inductor && chown -h nobody {tier}/inductor\n"
              f"chmod 0777 {top} {top}/tier {tier}\n"
              f"{sys.executable} -c '{VICTIM}' > {base}/out 2> {base}/err\n")
    victim_ran(base, script, environ)
    assert sorted(p.name for p in victims.iterdir()) == [f"thesis-{i}.tex" for i in range(5)]


def test_the_trim_never_follows_a_link_and_takes_a_future_date_for_an_old_one(base):
    """A tier of the user's own (trusted) whose inductor tree holds a link to a folder of the
    user's, and a JAX entry dated in the future: the trim removes nothing behind the link, and
    the future-dated entry, the least recently used by then, goes first."""
    exports, tier = exports_from_env(base, max_size="200k")
    environ = job_environ(base, exports)
    victims = base / "mine"
    victims.mkdir()
    (victims / "keep.txt").write_text("x" * 300_000)
    future = f"{tier}/jax/planted-{'1' * 64}-cache"
    script = (f"mkdir -p -m 0700 {tier.parents[1]} {tier.parent} {tier} {tier}/jax {tier}/inductor\n"
              f"head -c 300000 /dev/zero > {future} && touch -d '+1 year' {future}\n"
              f"ln -s '{victims}' {tier}/inductor/fx\n"
              f"{sys.executable} -c '{VICTIM}' > {base}/out 2> {base}/err\n"
              f"ls {tier}/jax > {base}/left\n")
    done = on_node(base, script, environ)
    assert done.returncode == 0, done.stderr[-3000:] + read(base / "err")
    assert not [line for line in (base / "err").read_text().splitlines() if line.startswith("gpu-cache:")]
    assert (victims / "keep.txt").stat().st_size == 300_000
    left = (base / "left").read_text().split()
    assert f"planted-{'1' * 64}-cache" not in left, left  # trimmed as the oldest
    assert any(name.endswith("-cache") for name in left), left  # the job's own entry stays


def test_the_trim_deletes_nothing_behind_a_kind_folder_that_became_a_link_after_start_up(base):
    """A tier of the user's own, trusted when the job starts; then ``<tier>/inductor`` is swapped
    for a link to a folder of the user's old files (over the bound, the least recently used):
    the exit trim runs (the future-dated entry goes) and removes nothing behind the link."""
    exports, tier = exports_from_env(base, max_size="200k")
    environ = job_environ(base, exports)
    victims = base / "mine"
    victims.mkdir()
    for i in range(3):
        (victims / f"keep-{i}.txt").write_text("x" * 300_000)
        os.utime(victims / f"keep-{i}.txt", (1e9, 1e9))
    future = f"{tier}/jax/planted-{'1' * 64}-cache"
    swap = (f"import os, jax, jax.numpy as jnp; os.rename('{tier}/inductor', '{tier}/inductor-was'); "
            f"os.symlink('{victims}', '{tier}/inductor'); {VICTIM.split('; ', 1)[1]}")
    script = (f"mkdir -p -m 0700 {tier.parents[1]} {tier.parent} {tier} {tier}/jax {tier}/inductor\n"
              f"head -c 300000 /dev/zero > {future} && touch -d '+1 year' {future}\n"
              f"{sys.executable} -c \"{swap}\" > {base}/out 2> {base}/err\n"
              f"ls {tier}/jax > {base}/left\n")
    victim_ran(base, script, environ)
    assert f"planted-{'1' * 64}-cache" not in (base / "left").read_text().split()  # the trim ran
    assert sorted(p.name for p in victims.iterdir()) == [f"keep-{i}.txt" for i in range(3)]
    assert all(p.stat().st_size == 300_000 for p in victims.iterdir())
