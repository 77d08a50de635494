"""Hostile files under the cache root, and hostile --output targets, made for real.

Everything under a cache root may have been put there by someone else: FIFOs, symlinks to a
zero device, device nodes, planted temporary files, links as stamps, trash folders and lock
files, truncated entries, decompression bombs. stats, prune, doctor --fix and doctor --explain
must finish, report the fake files as broken, remove them (never what they point to) and
never write outside the root. Device nodes are this test's own, made with mknod in a tmpfs
mounted in a private mount namespace; the machine's /dev is never touched.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import stat
import subprocess
import sys
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import clean_environ, jax_job_env, unavailable

TIMEOUT = 60  # seconds; every command here takes about one
#: Address-space cap of each CLI process: a reader that slurps /dev/zero or a bomb fails fast
#: instead of eating the machine's memory.
MEMORY_CAP = 2 << 30
HASHES = [f"{i:x}" * 64 for i in range(1, 10)]
TRITON_KEY = "A" * 52
OLD = time.time() - 2 * 3600  # beyond prune's grace period (1 h) and JAX's write grace (1 s)


@dataclass
class Run:
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float
    max_rss_bytes: int = 0

    def json(self) -> dict:
        return json.loads(self.stdout)


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


#: Runs a command and prints its peak RSS (KiB) on the last line of stderr: a fresh process
#: whose only child is the command, so RUSAGE_CHILDREN is that command's alone.
_RSS = ("import resource, subprocess, sys\n"
        "rc = subprocess.run(sys.argv[1:]).returncode\n"
        "print(f'maxrss={resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}', file=sys.stderr)\n"
        "sys.exit(rc)\n")


def cli(*args: str, namespace: int | None = None, timeout: float = TIMEOUT,
        env: dict[str, str] | None = None) -> Run:
    """``python -m gpu_cache ARGS`` with a memory cap and a timeout (optionally inside the
    mount namespace of process ``namespace``; ``env``: instead of a clean environment); a
    timeout is reported, not raised."""
    command = [sys.executable, "-c", _RSS, sys.executable, "-m", "gpu_cache", *args]
    if namespace is not None:
        command = ["nsenter", "-t", str(namespace), "-m", "--", *command]
    started = time.monotonic()
    try:
        done = subprocess.run(command, env=env or clean_environ(), capture_output=True, text=True,
                              timeout=timeout, preexec_fn=_cap_memory)
    except subprocess.TimeoutExpired as exc:
        return Run(None, str(exc.stdout or ""), str(exc.stderr or ""), True, time.monotonic() - started)
    lines = done.stderr.splitlines()
    rss = int(lines.pop()[len("maxrss="):]) * 1024 if lines and lines[-1].startswith("maxrss=") else 0
    stderr = "\n".join(lines) + ("\n" if lines else "")
    return Run(done.returncode, done.stdout, stderr, False, time.monotonic() - started, rss)


def one_line(run: Run) -> bool:
    return run.stderr.count("\n") == 1 and "Traceback" not in run.stderr


def ok(run: Run) -> Run:
    assert not run.timed_out, f"hung for {TIMEOUT} s"
    assert run.returncode == 0, run.stderr
    return run


@dataclass
class PrivateTmpfs:
    """A tmpfs at ``path`` seen only inside the mount namespace of process ``pid``; this
    process reaches it through ``view`` (``/proc/<pid>/root/<path>``)."""

    path: Path
    view: Path
    pid: int

    def mknod_char(self, relative: str, major: int, minor: int) -> Path:
        target = self.view / relative
        os.mknod(target, 0o600 | stat.S_IFCHR, os.makedev(major, minor))
        return target


@pytest.fixture
def private_tmpfs(tmp_path: Path):
    mount = tmp_path / "private"
    mount.mkdir()
    holder = subprocess.Popen(
        ["unshare", "-m", "sh", "-c",
         'mount -t tmpfs -o mode=0755,size=256m tmpfs "$0" && echo ready && exec sleep 600', str(mount)],
        stdout=subprocess.PIPE)
    try:
        if holder.stdout.readline() != b"ready\n":
            unavailable("cannot mount a tmpfs in a private mount namespace here (needs root and unshare)")
        view = Path(f"/proc/{holder.pid}/root") / str(mount).lstrip("/")
        # Device nodes go only into that private tmpfs: never into this namespace's folders.
        assert os.stat(view).st_dev != os.stat(mount).st_dev
        yield PrivateTmpfs(mount, view, holder.pid)
    finally:
        holder.kill()
        holder.wait()


def zlib_entry(payload: bytes = b"executable" * 100) -> bytes:
    """A -cache body as JAX writes it without zstandard: 4 bytes of compile time, then the
    executable, zlib-compressed."""
    return zlib.compress((1000).to_bytes(4, "little") + payload)


def age(*paths: Path) -> None:
    for path in paths:
        os.utime(path, (OLD, OLD), follow_symlinks=False)


# --- 1. only regular files are read, with a bound ----------------------------------------


def plant(kind: str, view: Path, name: Path, target: Path) -> None:
    """Put a FIFO, a symlink to ``target`` or a zero character device at ``name``."""
    if kind == "fifo":
        os.mkfifo(name)
    elif kind == "link":
        os.symlink(target, name)
    else:
        os.mknod(name, 0o600 | stat.S_IFCHR, os.makedev(1, 5))
    os.utime(name, (OLD, OLD), follow_symlinks=False)


@pytest.mark.parametrize("kind", ["fifo", "link", "device"],
                         ids=["FIFO", "symlink to a zero device", "zero character device"])
def test_fifos_zero_links_and_devices_named_like_entries_never_hang(kind, private_tmpfs):
    """Named as a JAX ``-cache``, a JAX ``-atime``, a record and a Triton group manifest:
    stats, prune --dry-run, doctor --explain and doctor --fix finish (exit 0), report them
    broken, and the real prune removes the names, never what they point to."""
    tmpfs = private_tmpfs
    zero = tmpfs.mknod_char("zero", 1, 5)  # the target of the links
    root_view = tmpfs.view / "root"
    for folder in ("jax", "records", f"triton/{TRITON_KEY}"):
        (root_view / folder).mkdir(parents=True)
    jax = root_view / "jax"
    hostile_cache = jax / f"jit_a-{HASHES[0]}-cache"
    plant(kind, tmpfs.view, hostile_cache, tmpfs.path / "zero")
    (jax / f"jit_b-{HASHES[1]}-cache").write_bytes(zlib_entry())
    hostile_atime = jax / f"jit_b-{HASHES[1]}-atime"
    plant(kind, tmpfs.view, hostile_atime, tmpfs.path / "zero")
    good = jax / f"jit_c-{HASHES[2]}-cache"
    good.write_bytes(zlib_entry())
    plant(kind, tmpfs.view, root_view / "records" / "r1.json", tmpfs.path / "zero")
    group = root_view / "triton" / TRITON_KEY
    (group / "k.json").write_text("{}")
    (group / "k.cubin").write_bytes(b"\x7fELF")
    plant(kind, tmpfs.view, group / "__grp__k.json", tmpfs.path / "zero")
    age(*jax.iterdir(), *group.iterdir(), group)
    root = str(tmpfs.path / "root")

    stats = ok(cli("stats", "--json", "--cache-root", root, namespace=tmpfs.pid)).json()
    assert stats["kinds"]["jax"]["broken"] == 2 and stats["kinds"]["triton"]["broken"] == 1
    problems = {e["key"]: e["problem"] for e in stats["kinds"]["jax"]["broken_entries"]}
    assert "never followed nor opened" in problems[f"jit_a-{HASHES[0]}"]
    assert "-atime is" in problems[f"jit_b-{HASHES[1]}"]

    dry = ok(cli("prune", "--dry-run", "--json", "--cache-root", root, namespace=tmpfs.pid)).json()
    assert {r["key"] for r in dry["jax"]["removed"]} == {f"jit_a-{HASHES[0]}", f"jit_b-{HASHES[1]}"}
    assert [r["key"] for r in dry["triton"]["removed"]] == [TRITON_KEY]
    assert os.path.lexists(hostile_cache) and os.path.lexists(group / "__grp__k.json")

    ok(cli("doctor", "--explain", "--json", "--cache-root", root, namespace=tmpfs.pid))

    fixed = ok(cli("doctor", "--fix", "--no-fail", "--json", "--cache-root", root,
                   namespace=tmpfs.pid)).json()["fixed"]
    assert fixed["jax"]["entries_removed"] == 2 and fixed["triton"]["entries_removed"] == 1
    assert not os.path.lexists(hostile_cache) and not os.path.lexists(hostile_atime)
    assert not os.path.lexists(group)
    assert good.exists(), "a good entry stays"
    assert stat.S_ISCHR(os.lstat(zero).st_mode), "the link's target is untouched"


@pytest.mark.slow
def test_a_zlib_bomb_named_as_an_entry_is_verified_in_bounded_memory_and_time(tmp_path):
    """4 MiB that inflate to 4 GiB: prune stops decompressing at its bound and removes it."""
    zeros = bytes(64 << 20)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = deflate.compress(zeros) + deflate.flush(zlib.Z_FULL_FLUSH)  # self-contained
    total = 64 * len(zeros)
    adler = ((total % 65521) << 16) | 1  # adler32 of `total` zero bytes
    bomb = b"\x78\xda" + block * 64 + deflate.flush(zlib.Z_FINISH) + adler.to_bytes(4, "big")
    folder = tmp_path / "root" / "jax"
    folder.mkdir(parents=True)
    entry = folder / f"jit_bomb-{HASHES[0]}-cache"
    entry.write_bytes(bomb)
    age(entry)
    run = ok(cli("prune", "--json", "--cache-root", str(tmp_path / "root")))
    reasons = [r["reason"] for r in run.json()["jax"]["removed"]]
    assert len(reasons) == 1 and "decompression bomb" in reasons[0]
    assert not entry.exists()
    assert run.max_rss_bytes < 256 << 20, f"peak memory {run.max_rss_bytes >> 20} MiB"
    assert run.seconds < 30


# --- 2. truncated zstd entries are found ----------------------------------------------------

PROGRAMS = """
import jax, jax.numpy as jnp, numpy as np
def program(i):  # big enough that zstd writes more than one block (> 128 KiB)
    def f(x):
        for k in range(40):
            x = jnp.sin(x) * (i + k + 1) + jnp.cos(x @ x.T)
        return x
    return f
for i in range(3):
    jax.jit(program(i))(np.ones((8, 8), np.float32)).block_until_ready()
"""


@pytest.fixture(scope="module")
def zstd_cache(tmp_path_factory) -> Path:
    import zstandard  # noqa: F401  # the test extra installs it: never skip silently
    folder = tmp_path_factory.mktemp("zstd") / "jax"
    subprocess.run([sys.executable, "-c", PROGRAMS], env=jax_job_env(folder, shared_fs=True),
                   check=True, timeout=300)
    entries = sorted(folder.glob("*-cache"))
    assert len(entries) == 3 and all(e.read_bytes()[:4] == b"\x28\xb5\x2f\xfd" for e in entries)
    return folder


def without_zstandard(tmp_path: Path) -> dict[str, str]:
    """The CLI's environment with ``zstandard`` hidden from its Python (as in a Snakemake
    environment without it), while the jobs that wrote the entries had it."""
    hidden = tmp_path / "no-zstandard"
    hidden.mkdir()
    (hidden / "zstandard.py").write_text("raise ImportError('hidden for this test')\n")
    env = clean_environ()
    env["PYTHONPATH"] = os.pathsep.join([str(hidden), env["PYTHONPATH"]])
    probe = subprocess.run([sys.executable, "-c", "import zstandard"], env=env, capture_output=True)
    assert probe.returncode != 0, "zstandard must be hidden"
    return env


@pytest.mark.parametrize("zstandard", ["zstandard", "no zstandard"])
@pytest.mark.parametrize("command", [["prune", "--json"], ["doctor", "--fix", "--no-fail", "--json"]])
def test_zstd_entries_cut_to_50_and_90_percent_are_removed(command, zstandard, zstd_cache, tmp_path):
    """Without zstandard gpu-cache walks the frame's block headers (#21): before, it kept
    them (no decoder, no check)."""
    root = tmp_path / "root"
    shutil.copytree(zstd_cache, root / "jax")
    entries = sorted((root / "jax").glob("*-cache"))
    for entry, fraction in zip(entries[:2], (0.5, 0.9), strict=True):
        data = entry.read_bytes()
        entry.write_bytes(data[:int(len(data) * fraction)])
    age(*entries)
    env = without_zstandard(tmp_path) if zstandard == "no zstandard" else None
    report = ok(cli(*command, "--cache-root", str(root), env=env)).json()
    removed = (report if command[0] == "prune" else report["fixed"])["jax"]["removed"]
    assert sorted(r["key"] + "-cache" for r in removed) == sorted(e.name for e in entries[:2])
    assert all("truncated" in r["reason"] for r in removed)
    assert entries[2].exists()
    # Before, every later run warned (or failed, raising on cache errors): now it works.
    subprocess.run([sys.executable, "-c", PROGRAMS], check=True, timeout=300,
                   env=jax_job_env(root / "jax", shared_fs=True, JAX_RAISE_PERSISTENT_CACHE_ERRORS="true"))
    assert len(list((root / "jax").glob("*-cache"))) == 3


def flip_middle(path: Path, fresh_mtime: bool) -> None:
    """Damage ``path`` in place as a storage fault does: 64 bytes in its middle inverted, the
    size (and inode) kept; then its old mtime put back, or a recent one (as a hit sets)."""
    info = path.stat()
    with path.open("r+b") as file:
        file.seek(info.st_size // 2)
        data = file.read(64)
        file.seek(info.st_size // 2)
        file.write(bytes(b ^ 0xFF for b in data))
    if fresh_mtime:
        os.utime(path, (time.time() - 5, time.time() - 5))  # older than JAX's write grace
    else:
        os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert path.stat().st_size == info.st_size


@pytest.mark.slow
@pytest.mark.parametrize("command", ["prune", "doctor --fix"])
@pytest.mark.parametrize("mtime", ["old mtime put back", "fresh mtime"])
def test_a_verified_entry_damaged_in_place_with_its_size_kept_is_removed(command, mtime, zstd_cache,
                                                                          tmp_path):
    """A JAX entry verified whole, then damaged with its size kept (#21): before, it stayed
    "verified" and every job warned and recompiled (failed when raising on cache errors).
    ``doctor --fix`` verifies every entry again; a prune reads entries verified before again
    (a small cache all of them; a large one a share, in turn: test_prune.py), so a dry run
    finds it and remembers it, and the next prune removes it. The entries that were not
    damaged stay."""
    root = tmp_path / "root"
    shutil.copytree(zstd_cache, root / "jax")
    entries = sorted((root / "jax").glob("*-cache"))
    age(*entries)
    first = ok(cli("prune", "--json", "--cache-root", str(root))).json()
    assert first["jax"]["entries_removed"] == 0  # all three verified whole, and recorded
    victim = entries[0]
    flip_middle(victim, fresh_mtime=mtime == "fresh mtime")
    raising = jax_job_env(root / "jax", shared_fs=True, JAX_RAISE_PERSISTENT_CACHE_ERRORS="true")
    damaged = subprocess.run([sys.executable, "-c", PROGRAMS], env=raising, capture_output=True,
                             text=True, timeout=300)
    assert damaged.returncode != 0, "the damage is real: JAX cannot read the entry"
    if command == "doctor --fix":
        removed = ok(cli("doctor", "--fix", "--no-fail", "--json", "--cache-root", str(root))
                     ).json()["fixed"]["jax"]["removed"]
    else:
        dry = ok(cli("prune", "--dry-run", "--json", "--cache-root", str(root))).json()
        assert [r["key"] + "-cache" for r in dry["jax"]["removed"]] == [victim.name]
        assert victim.exists(), "a dry run removes nothing"
        removed = ok(cli("prune", "--json", "--cache-root", str(root))).json()["jax"]["removed"]
    assert [r["key"] + "-cache" for r in removed] == [victim.name]
    # (doctor --fix decompresses everything again: zstd may notice the damage first)
    assert "changed after it was verified" in removed[0]["reason"] or (
        command == "doctor --fix" and "does not decompress" in removed[0]["reason"])
    assert not victim.exists() and entries[1].exists() and entries[2].exists()
    subprocess.run([sys.executable, "-c", PROGRAMS], env=raising, check=True, timeout=300)


# --- 3. no write, rename or delete through a symlink inside the root ---------------------


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder outside the cache root with a file that must never change."""
    folder = tmp_path / "outside"
    folder.mkdir()
    secret = folder / "secret.txt"
    secret.write_text("not yours\n")
    os.utime(secret, (OLD, OLD))
    return folder


def unchanged(path: Path) -> bool:
    info = path.stat()
    return path.read_bytes() == b"not yours\n" and info.st_mtime == OLD


def test_planted_atime_temp_links_are_not_written_through_and_stale_temps_go(tmp_path, outside):
    """A size-capped cache with a lone ``-cache``: prune writes its ``-atime`` through a
    fresh temporary file, never through the planted ``.<key>-atime.tmp`` link, and removes
    that link (old) and its own stale temporary files."""
    folder = tmp_path / "root" / "jax"
    folder.mkdir(parents=True)
    (folder / ".lockfile").touch()  # JAX keeps one with a size cap
    key = f"jit_c-{HASHES[0]}"
    (folder / f"{key}-cache").write_bytes(zlib_entry())
    planted = folder / f".{key}-atime.tmp"
    planted.symlink_to(outside / "secret.txt")
    stale = folder / f".{key}-atime.4242.deadbeef.tmp"
    stale.write_bytes(b"12345678")
    age(folder / f"{key}-cache", planted, stale)
    report = ok(cli("prune", "--json", "--cache-root", str(tmp_path / "root"))).json()["jax"]
    assert report["repaired"] == 1
    assert unchanged(outside / "secret.txt")
    atime = folder / f"{key}-atime"
    assert stat.S_ISREG(atime.lstat().st_mode) and len(atime.read_bytes()) == 8
    assert not os.path.lexists(planted) and not stale.exists()
    assert [p.name for p in folder.iterdir() if p.name.endswith(".tmp")] == []


def test_a_verified_stamp_link_is_replaced_not_followed(tmp_path, outside):
    folder = tmp_path / "root" / "jax"
    folder.mkdir(parents=True)
    (folder / f"jit_c-{HASHES[0]}-cache").write_bytes(zlib_entry())
    age(folder / f"jit_c-{HASHES[0]}-cache")
    stamp = folder / ".gpu-cache-verified"
    stamp.symlink_to(outside / "secret.txt")
    report = ok(cli("prune", "--json", "--cache-root", str(tmp_path / "root"))).json()
    assert report["problems"] == []
    assert unchanged(outside / "secret.txt")
    assert stat.S_ISREG(stamp.lstat().st_mode) and time.time() - stamp.stat().st_mtime < 60


def test_a_trash_folder_link_never_takes_entries_outside(tmp_path, outside):
    triton = tmp_path / "root" / "triton"
    group = triton / TRITON_KEY
    group.mkdir(parents=True)
    (group / "k.source").write_text("a kernel whose writer died")  # no manifest: broken
    age(*group.iterdir(), group)
    (triton / ".gpu-cache-trash").symlink_to(outside, target_is_directory=True)
    os.utime(outside, (OLD, OLD))
    report = ok(cli("prune", "--json", "--kind", "triton", "--cache-root", str(tmp_path / "root"))).json()
    assert TRITON_KEY in {r["key"] for r in report["triton"]["removed"]}, report
    assert report["problems"] == []
    assert not group.exists()
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert outside.stat().st_mtime == OLD, "nothing was moved into (or out of) the outside folder"
    assert unchanged(outside / "secret.txt")
    trash = triton / ".gpu-cache-trash"
    assert not trash.is_symlink() and list(trash.iterdir()) == []


def test_lock_file_links_are_replaced_not_followed(tmp_path, outside):
    """``<root>/.prune.lock`` and JAX's ``.lockfile`` planted as links to a file outside:
    prune still runs (locking a regular file of its own) and the outside file is unchanged."""
    root = tmp_path / "root"
    folder = root / "jax"
    folder.mkdir(parents=True)
    other = outside / "other.txt"
    other.write_text("not yours\n")
    os.utime(other, (OLD, OLD))
    (root / ".prune.lock").symlink_to(outside / "secret.txt")
    (folder / ".lockfile").symlink_to(other)
    broken = folder / f"jit_e-{HASHES[0]}-cache"
    broken.touch()  # empty: what a full disk leaves; prune removes it under JAX's lock
    (folder / f"jit_e-{HASHES[0]}-atime").write_bytes(time.time_ns().to_bytes(8, "little"))
    report = ok(cli("prune", "--json", "--cache-root", str(root))).json()
    assert report["problems"] == [] and report["jax"]["entries_removed"] == 1
    assert not broken.exists()
    assert unchanged(outside / "secret.txt") and unchanged(other)
    assert stat.S_ISREG((root / ".prune.lock").lstat().st_mode)
    assert not (folder / ".lockfile").is_symlink()


#: For each prunable kind, files of the user's own that its inventory takes for entries (a
#: prune with --max-size 1K --max-age 1s removes them all when they lie in the kind's folder).
SQUEEZE = ("--max-size", "1K", "--max-age", "1s")


def test_a_kind_folder_that_links_inside_the_root_is_pruned(tmp_path):
    """A link that stays inside the root (a renamed folder) is followed: the entries go."""
    root = tmp_path / "root"
    (root / "jax-v2").mkdir(parents=True)
    (root / "jax-v2" / f"jit_mine-{HASHES[0]}-cache").write_bytes(zlib_entry())
    age(*(root / "jax-v2").iterdir())
    (root / "jax").symlink_to(root / "jax-v2", target_is_directory=True)
    report = ok(cli("prune", "--json", *SQUEEZE, "--cache-root", str(root))).json()
    assert report["problems"] == [] and report["jax"]["entries_removed"] == 1
    assert not (root / "jax-v2" / f"jit_mine-{HASHES[0]}-cache").exists()


# --- 4. --output never replaces what it is given -----------------------------------------


def prune_output(root: Path, target: Path, namespace: int | None = None) -> Run:
    return cli("prune", "--dry-run", "--cache-root", str(root), "--output", str(target),
               namespace=namespace)


@pytest.mark.slow
def test_output_through_a_symlink_writes_its_target_and_keeps_the_link(tmp_path, outside):
    link = tmp_path / "report.json"
    link.symlink_to(outside / "secret.txt")
    ok(prune_output(tmp_path / "root", link))
    assert link.is_symlink()
    assert json.loads((outside / "secret.txt").read_text())["dry_run"] is True
    assert [p.name for p in outside.iterdir()] == ["secret.txt"], "no temporary file left"
    dangling = tmp_path / "later.json"
    dangling.symlink_to(outside / "new.json")
    ok(prune_output(tmp_path / "root", dangling))
    assert dangling.is_symlink() and json.loads((outside / "new.json").read_text())["dry_run"] is True
    # A link like /dev/stdout (this test's own): the report reaches the pipe it leads to.
    stdout = tmp_path / "stdout"
    stdout.symlink_to("/proc/self/fd/1")
    run = ok(prune_output(tmp_path / "root", stdout))
    assert json.loads(run.stdout)["dry_run"] is True and stdout.is_symlink()


def test_output_to_a_fifo_without_a_reader_is_refused_and_with_one_is_written(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    run = prune_output(tmp_path / "root", fifo)
    assert not run.timed_out and run.returncode == 1 and one_line(run), run.stderr
    assert "no process reads" in run.stderr
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    time.sleep(0.2)  # the reader has it open before the writer comes
    ok(prune_output(tmp_path / "root", fifo))
    reader.join(timeout=TIMEOUT)
    assert json.loads(received[0])["dry_run"] is True
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_output_to_a_character_device_writes_into_it_and_keeps_it(private_tmpfs, tmp_path):
    null = private_tmpfs.mknod_char("null", 1, 3)  # this test's own null device
    report = tmp_path / "prune.json"  # summary's input (it needs a verdict or a prune report)
    ok(cli("prune", "--dry-run", "--output", str(report), "--cache-root", str(private_tmpfs.path / "root"),
           namespace=private_tmpfs.pid))
    for command in (["prune", "--dry-run", "--output"], ["summary", "--output"],
                    ["doctor", "--no-fail", "--output"]):
        ok(cli(*command, str(private_tmpfs.path / "null"), "--cache-root",
               str(private_tmpfs.path / "root"), namespace=private_tmpfs.pid)
           if command[0] != "summary" else
           cli(*command, str(private_tmpfs.path / "null"), "--prune", str(report),
               namespace=private_tmpfs.pid))
        info = os.lstat(null)
        assert stat.S_ISCHR(info.st_mode) and info.st_rdev == os.makedev(1, 3), command
    assert sorted(p.name for p in private_tmpfs.view.iterdir()) == ["null"]  # (a diagnosis makes no root)


def test_output_to_a_folder_is_refused_with_one_line(tmp_path):
    folder = tmp_path / "reports"
    folder.mkdir()
    (folder / "keep").write_text("x")
    run = prune_output(tmp_path / "root", folder)
    assert run.returncode == 2 and one_line(run) and "is a folder" in run.stderr, run.stderr
    assert [p.name for p in folder.iterdir()] == ["keep"]


def test_plots_follow_links_and_refuse_an_outdir_that_is_a_file(tmp_path, outside):
    outdir = tmp_path / "plots"
    outdir.mkdir()
    (outdir / "cache_size.svg").symlink_to(outside / "secret.txt")
    ok(cli("plots", "--outdir", str(outdir), "--cache-root", str(tmp_path / "root")))
    assert (outdir / "cache_size.svg").is_symlink()
    assert (outside / "secret.txt").read_text().startswith("<svg")
    assert sorted(p.name for p in outdir.iterdir()) == ["cache_size.svg", "cold_warm.svg", "hit_rates.svg"]
    run = cli("plots", "--outdir", str(outside / "secret.txt"), "--cache-root", str(tmp_path / "root"))
    assert run.returncode == 2 and one_line(run) and "not a folder" in run.stderr, run.stderr
