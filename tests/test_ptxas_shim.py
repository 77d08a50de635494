"""The ptxas shim (issue 34): what it keys on, what it passes through, and, with the real ptxas
from Triton's wheel on real PTX made here by Triton's compiler, that a hit is what the real
ptxas would have written, from a folder it trusts, and that it never runs itself."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_cache.core import names
from gpu_cache.core.kinds import ptxas_format as ptxas_cache
from helpers import run_cli_here, unavailable
from ptxas_fixtures import (
    DIGEST,
    SHIM,
    SHIM_DIR,
    assemble,
    make_ptx,
    mode_of,
    older_ptxas,
    runs,
    shim_environ,
    site_wrapper,
    triton_ptxas,
)

XLA_CALL = ["/tmp/tempfile-h-1-2-3", "-o", "/tmp/tempfile-h-1-2-4", "-arch=sm_90a", "--warn-on-spills"]


# --- pure functions -------------------------------------------------------------------------

def test_xlas_and_jaxlibs_call_is_served_with_the_file_names_taken_out():
    source, output, options = SHIM.parse(XLA_CALL)
    assert (source, output) == ("/tmp/tempfile-h-1-2-3", "/tmp/tempfile-h-1-2-4")
    assert options == ["<input>", "-o", "<output>", "-arch", "sm_90a", "--warn-on-spills"]
    # another spelling of the same options, other file names: the same options
    assert SHIM.parse(["-arch", "sm_90a", "a.ptx", "--output-file=b.cubin", "--warn-on-spills"])[2] == \
        ["-arch", "sm_90a", "<input>", "--output-file", "<output>", "--warn-on-spills"]
    # jaxlib's extra flags (JAX_TRITON_PTXAS_EXTRA_FLAGS, --device-debug) and -v stay in the options
    assert SHIM.parse([*XLA_CALL, "-O3", "--device-debug", "-v"])[2][-3:] == ["-O3", "--device-debug", "-v"]


@pytest.mark.parametrize("args, why", [
    (["--version"], "option '--version'"),
    (["a.ptx", "b.ptx", "-o", "x"], "several inputs"),
    (["-", "-o", "x"], "input from stdin"),
    (["a.ptx", "-arch=sm_90a"], "no output file"),
    (["a.ptx", "-o", "x", "--input-as-string", ".version 99.99"], "option '--input-as-string'"),
    (["a.ptx", "-o", "x", "--options-file", "f"], "option '--options-file'"),
    (["a.ptx", "-o"], "-o without a value"),
    (["a.ptx", "-o", "a.ptx"], "output over its input"),
])
def test_other_forms_pass_through(args, why):
    with pytest.raises(SHIM.Pass, match=why.replace("(", r"\(").replace(")", r"\)")):
        SHIM.parse(args)


def test_a_kept_stderr_names_this_callers_files():
    err = b"ptxas /tmp/tempfile-a-1, line 10; warning : Program is doing double precision computations.\n"
    kept = SHIM.keep_names(err, "/tmp/tempfile-a-1", "/tmp/tempfile-a-2")
    assert b"/tmp/tempfile-a-1" not in kept
    assert SHIM.put_names(kept, "/tmp/tempfile-b-7", "/tmp/tempfile-b-8") == err.replace(b"a-1", b"b-7")
    # a short name could be part of words: it is kept as it was
    assert SHIM.keep_names(b"ptxas a, line 1", "a", "b") == b"ptxas a, line 1"


def test_an_entry_is_served_only_whole_as_written_and_under_its_own_key():
    key, other = "a" * 64, "b" * 64
    data = SHIM.pack_entry(key, b"out", b"err", b"\x7fELF cubin", 1.5, "k\x1fptxas 13.4")
    assert SHIM.unpack_entry(data, key) == (b"out", b"err", b"\x7fELF cubin", 1.5, "k\x1fptxas 13.4")
    body = DIGEST.opened(data)
    flipped = data[:-3] + bytes([data[-3] ^ 1]) + data[-2:]  # one bit of the cubin
    for bad, name, why in [
            (data, other, "the entry of another key"),  # renamed to another key: never served
            (flipped, key, DIGEST.DAMAGED), (data[:-1], key, DIGEST.DAMAGED),
            (data + b"x", key, DIGEST.DAMAGED),
            (DIGEST.framed(body[:-1]), key, "not whole"),  # cut short, then framed
            (body, key, "not an entry of this format"),  # an older gpu-cache's: no frame
            (DIGEST.framed(body.replace(SHIM.ENTRY_MAGIC, b"gpu-cache ptxas entry 1\n")), key,
             "not an entry of this format")]:
        with pytest.raises(ValueError, match=re.escape(why)):
            SHIM.unpack_entry(bad, name)


def test_the_key_holds_the_ptxas_the_options_and_the_input():
    base = ("d" * 64, b"release 13.4, V13.4.59", ["<input>", "-arch", "sm_90a"], b"ptx-digest")
    key = SHIM.key_of(*base)
    assert SHIM.key_of(*base) == key
    assert SHIM.key_of("e" * 64, *base[1:]) != key
    assert SHIM.key_of(base[0], b"release 12.9, V12.9.86", *base[2:]) != key
    assert SHIM.key_of(*base[:2], ["<input>", "-arch", "sm_80"], base[3]) != key
    assert SHIM.key_of(*base[:3], b"other-digest") != key


def test_the_real_ptxas_is_the_next_on_path_never_a_shim(tmp_path):
    real = tmp_path / "cuda" / "ptxas"
    real.parent.mkdir()
    real.write_text("#!/bin/sh\nexit 0\n")
    real.chmod(0o755)
    copy = tmp_path / "copy"
    shutil.copytree(SHIM_DIR, copy)  # another checkout's shim
    link = tmp_path / "link"
    link.mkdir()
    (link / "ptxas").symlink_to(SHIM.FRONT)  # the shim again, through a link
    path = os.pathsep.join(["/nonexistent", str(SHIM_DIR), "relative", str(copy), str(link),
                            str(real.parent)])
    assert SHIM.real_ptxas({"PATH": path}) == str(real)
    assert SHIM.real_ptxas({"PATH": f"{copy}:{SHIM_DIR}:{real.parent}"}) == str(real)
    REAL, NESTED = names.PTXAS_REAL_VAR, names.PTXAS_NESTED_VAR
    # only shims after it: the one the hook found, unless that is a shim too
    assert SHIM.real_ptxas({"PATH": f"{SHIM_DIR}:{copy}", REAL: str(real)}) == str(real)
    assert SHIM.real_ptxas({"PATH": f"{SHIM_DIR}:{copy}", REAL: str(link / "ptxas")}) is None
    # called from the real one (a wrapper that runs ptxas again): never the named one
    assert SHIM.real_ptxas({"PATH": str(SHIM_DIR), REAL: str(real), NESTED: "1"}) is None


# --- with the real ptxas ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def ptx(tmp_path_factory) -> dict[str, Path]:
    return make_ptx(tmp_path_factory.mktemp("ptx"))


@pytest.fixture
def site(tmp_path):
    """A site's ptxas (a logging wrapper around Triton's CUDA 13.4 ptxas), its log, the cache."""
    log = tmp_path / "real-runs.log"
    return site_wrapper(tmp_path / "site", triton_ptxas(), log), log, tmp_path / "root" / "ptxas"


@pytest.mark.slow
def test_a_hit_is_the_real_output_byte_for_byte_under_another_name(ptx, site, tmp_path):
    wrapper, log, cache = site
    environ = shim_environ(cache, wrapper.parent)
    first, second = tmp_path / "tempfile-node-11-1", tmp_path / "tempfile-node-22-7"
    shutil.copy(ptx["spill"], first)
    shutil.copy(ptx["spill"], second)
    missed = assemble(first, tmp_path / "a.cubin", environ)
    hit = assemble(second, tmp_path / "b.cubin", environ)
    real = subprocess.run([str(triton_ptxas()), str(second), "-o", str(tmp_path / "c.cubin"),
                           "-arch=sm_90a", "--warn-on-spills"], capture_output=True)
    assert (missed.returncode, hit.returncode, real.returncode) == (0, 0, 0)
    assert runs(log) == 1  # the second call never ran the real ptxas
    assert (tmp_path / "b.cubin").read_bytes() == (tmp_path / "a.cubin").read_bytes() == \
        (tmp_path / "c.cubin").read_bytes()
    # XLA reads this line to drop a spilling autotuning config: a hit says it as the real run did
    assert b"Registers are spilled" in hit.stderr
    assert hit.stderr == missed.stderr
    entries = ptxas_cache.scan(cache, 0.0)
    assert [e.name for e in entries if e.key.endswith(".ptxas")] == ["mm"]
    assert all(e.problem is None for e in entries)


@pytest.mark.slow
def test_a_hit_names_this_callers_file_in_the_warnings(ptx, site, tmp_path):
    wrapper, log, cache = site
    environ = shim_environ(cache, wrapper.parent)
    names = [tmp_path / "tempfile-first-call", tmp_path / "tempfile-second-call"]
    done = []
    for name in names:
        shutil.copy(ptx["f64"], name)
        done.append(assemble(name, tmp_path / "o.cubin", environ, "--warn-on-double-precision-use"))
    assert runs(log) == 1
    assert done[0].stderr.count(b"tempfile-first-call, line") == 3
    assert done[1].stderr == done[0].stderr.replace(b"tempfile-first-call", b"tempfile-second-call")


@pytest.mark.slow
def test_other_ptx_another_ptxas_or_other_options_run_the_real_one(ptx, site, tmp_path):
    wrapper, log, cache = site
    environ = shim_environ(cache, wrapper.parent)
    for name in ("add87", "add87", "mm"):
        assert assemble(ptx[name], tmp_path / "o.cubin", environ).returncode == 0
    assert runs(log) == 2
    assert assemble(ptx["add87"], tmp_path / "o.cubin", environ, "-O1").returncode == 0
    assert runs(log) == 3
    # the same PTX and options through CUDA 12.9's ptxas: its own entry, not 13.4's output
    older_log = tmp_path / "older.log"
    older = site_wrapper(tmp_path / "older", older_ptxas(), older_log)
    done = assemble(ptx["add87"], tmp_path / "older.cubin", shim_environ(cache, older.parent))
    assert done.returncode == 0 and runs(older_log) == 1
    direct = tmp_path / "direct.cubin"
    subprocess.run([str(older_ptxas()), str(ptx["add87"]), "-o", str(direct), "-arch=sm_90a",
                    "--warn-on-spills"], check=True)
    assert (tmp_path / "older.cubin").read_bytes() == direct.read_bytes()


@pytest.mark.slow
def test_a_failure_and_a_version_probe_are_the_real_ones_and_nothing_is_kept(ptx, tmp_path):
    log = tmp_path / "runs.log"
    wrapper = site_wrapper(tmp_path / "site", older_ptxas(), log)  # CUDA 12.9: refuses PTX 9.4
    cache = tmp_path / "root" / "ptxas"
    environ = shim_environ(cache, wrapper.parent)
    direct = subprocess.run([str(older_ptxas()), str(ptx["add"]), "-o", str(tmp_path / "x"), "-arch=sm_90a",
                             "--warn-on-spills"], capture_output=True)
    through = assemble(ptx["add"], tmp_path / "x", environ)
    assert direct.returncode != 0
    assert (through.returncode, through.stderr) == (direct.returncode, direct.stderr)
    assemble(ptx["add"], tmp_path / "x", environ)
    assert runs(log) == 2  # a failure is run again, never replayed
    assert not any(e.key.endswith(".ptxas") for e in ptxas_cache.scan(cache, 0.0))
    probe = subprocess.run(["ptxas", "--version"], env=environ, capture_output=True)
    assert probe.stdout == subprocess.run([str(older_ptxas()), "--version"], capture_output=True).stdout


@pytest.mark.slow
@pytest.mark.parametrize("umask", [0o000, 0o077])
def test_entries_get_safe_modes_whatever_the_umask(ptx, site, tmp_path, umask):
    wrapper, _log, cache = site
    environ = shim_environ(cache, wrapper.parent)
    old = os.umask(umask)
    try:
        assert assemble(ptx["add"], tmp_path / "o.cubin", environ).returncode == 0
    finally:
        os.umask(old)
    assert sorted(mode_of(p) for p in cache.iterdir()) == [0o644, 0o644]  # the entry, the identity


def _plant_fake_entry(ptx, site, tmp_path) -> tuple[Path, dict[str, str]]:
    """Fill the cache with the real entry of ``add``, then put a fake cubin into it (same key,
    a valid header): what another user who could write there would do."""
    wrapper, _log, cache = site
    environ = shim_environ(cache, wrapper.parent)
    assert assemble(ptx["add"], tmp_path / "real.cubin", environ).returncode == 0
    entry = next(p for p in cache.iterdir() if p.suffix == ".ptxas")
    data = SHIM.unpack_entry(entry.read_bytes(), entry.stem)
    fake = SHIM.pack_entry(entry.stem, data[0], data[1], b"FAKE CUBIN", data[3], data[4])
    entry.unlink()
    entry.write_bytes(fake)
    entry.chmod(0o644)
    return entry, environ


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["folder writable by others", "entry owned by nobody",
                                   "entry writable by others", "entry is a link", "folder is a link",
                                   "root owned by nobody", "a folder above the root owned by nobody",
                                   "root writable by a group not yours"])
def test_a_folder_or_entry_others_could_write_is_never_served(ptx, site, tmp_path, fault):
    entry, environ = _plant_fake_entry(ptx, site, tmp_path)
    assert assemble(ptx["add"], tmp_path / "fake.cubin", environ).returncode == 0
    assert (tmp_path / "fake.cubin").read_bytes() == b"FAKE CUBIN"  # as planted: trusted, served
    cache = entry.parent
    if fault == "folder writable by others":
        cache.chmod(0o777)
    elif fault == "entry owned by nobody":
        os.chown(entry, 65534, 65534)
    elif fault == "entry writable by others":
        entry.chmod(0o666)
    elif fault == "root owned by nobody":  # the folders above: the hook's rule (issue 37)
        os.chown(cache.parent, 65534, -1)
    elif fault == "a folder above the root owned by nobody":
        os.chown(tmp_path, 65534, -1)
    elif fault == "root writable by a group not yours":
        os.chown(cache.parent, -1, 65534)
        cache.parent.chmod(0o2775)
    elif fault == "entry is a link":
        moved = tmp_path / "elsewhere"
        entry.rename(moved)
        entry.symlink_to(moved)
    else:
        cache.rename(tmp_path / "moved")
        cache.symlink_to(tmp_path / "moved")
    assert assemble(ptx["add"], tmp_path / "out.cubin", environ).returncode == 0
    assert (tmp_path / "out.cubin").read_bytes() == (tmp_path / "real.cubin").read_bytes()


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="a read-only bind mount needs root")
def test_a_read_only_cache_serves_hits_and_keeps_nothing_new(ptx, site, tmp_path):
    wrapper, log, cache = site
    environ = shim_environ(cache, wrapper.parent)
    assert assemble(ptx["add"], tmp_path / "o.cubin", environ).returncode == 0
    subprocess.run(["mount", "--bind", str(cache), str(cache)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(cache)], check=True)
        hit = assemble(ptx["add"], tmp_path / "hit.cubin", environ)
        missed = assemble(ptx["mm"], tmp_path / "miss.cubin", environ)
    finally:
        subprocess.run(["umount", "-l", str(cache)], capture_output=True)
    assert (hit.returncode, missed.returncode) == (0, 0)
    assert (tmp_path / "hit.cubin").read_bytes() == (tmp_path / "o.cubin").read_bytes()
    assert (tmp_path / "miss.cubin").stat().st_size > 0
    assert runs(log) == 2  # add: once before; mm: the real one, since nothing can be kept
    assert len([p for p in cache.iterdir() if p.suffix == ".ptxas"]) == 1


@pytest.mark.slow
def test_a_wrapper_that_runs_ptxas_again_through_path_gets_the_next_one(ptx, tmp_path):
    real_dir = tmp_path / "cuda"
    real_dir.mkdir()
    (real_dir / "ptxas").symlink_to(triton_ptxas())
    wrapper_dir = tmp_path / "site"
    wrapper_dir.mkdir()
    wrapper = wrapper_dir / "ptxas"  # a module-style wrapper: drops itself from PATH, runs "ptxas"
    wrapper.write_text(f'#!/bin/sh\nPATH=$(echo "$PATH" | sed "s#{wrapper_dir}:##")\nexec ptxas "$@"\n')
    wrapper.chmod(0o755)
    environ = shim_environ(tmp_path / "root" / "ptxas", wrapper_dir, real_dir)
    done = assemble(ptx["add"], tmp_path / "o.cubin", environ)
    assert done.returncode == 0, done.stderr
    assert assemble(ptx["add"], tmp_path / "p.cubin", environ).returncode == 0
    assert (tmp_path / "o.cubin").read_bytes() == (tmp_path / "p.cubin").read_bytes()


@pytest.mark.slow
def test_only_shims_on_path_is_an_error_never_a_loop(tmp_path):
    environ = shim_environ(tmp_path / "root" / "ptxas")
    environ["PATH"] = f"{SHIM_DIR}:/usr/bin:/bin"
    done = subprocess.run(["ptxas", "--version"], env=environ, capture_output=True, timeout=30)
    assert done.returncode == 127 and b"no real ptxas" in done.stderr


@pytest.mark.slow
def test_processes_that_miss_one_kernel_at_once_run_the_real_ptxas_once(ptx, tmp_path):
    log = tmp_path / "runs.log"
    slow = tmp_path / "site" / "ptxas"  # a real run that takes 2 s: the others start meanwhile
    slow.parent.mkdir()
    slow.write_text(f'#!/bin/sh\necho "$@" >> "{log}"\nsleep 2\nexec {triton_ptxas()} "$@"\n')
    slow.chmod(0o755)
    locks = tmp_path / "root" / "locks"
    environ = shim_environ(tmp_path / "root" / "ptxas", slow.parent, GPU_CACHE_LOCKS=str(locks))
    started = [subprocess.Popen(["ptxas", str(ptx["add"]), "-o", str(tmp_path / f"{n}.cubin"),
                                 "-arch=sm_90a"], env=environ) for n in range(4)]
    assert [p.wait(timeout=120) for p in started] == [0, 0, 0, 0]
    assert runs(log) == 1
    assert len({(tmp_path / f"{n}.cubin").read_bytes() for n in range(4)}) == 1


# --- issue 37: only the output of the ptxas that would really run ---------------------------

def _real_output(ptxas: Path, ptx: Path, out: Path) -> bytes:
    subprocess.run([str(ptxas), str(ptx), "-o", str(out), "-arch=sm_90a", "--warn-on-spills"], check=True)
    return out.read_bytes()


def _entries(cache: Path) -> list[Path]:
    return [p for p in cache.iterdir() if p.suffix == ".ptxas"]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["process substitution", "/dev/stdin from a pipe"])
def test_an_input_that_is_not_a_regular_file_reaches_the_real_ptxas_and_is_never_cached(ptx, site, tmp_path,
                                                                                         how):
    wrapper, log, cache = site
    # the same calls without the shim (ptxas writes the name it was run by into the cubin)
    plain_bin = site_wrapper(tmp_path / "plain", triton_ptxas(), tmp_path / "x").parent
    plain = dict(os.environ, PATH=f"{plain_bin}:/usr/bin:/bin")
    for kernel in ("add", "mm"):  # the second one must get its own cubin, not the first one's
        outs = []
        for environ in (shim_environ(cache, wrapper.parent), plain):
            outs.append(tmp_path / f"{kernel}-{len(outs)}.cubin")
            call = f'ptxas {{}} -o "{outs[-1]}" -arch=sm_90a --warn-on-spills'
            script = (call.format(f'<(cat "{ptx[kernel]}")') if how == "process substitution" else
                      f'cat "{ptx[kernel]}" | {call.format("/dev/stdin")}')
            done = subprocess.run(["bash", "-c", script], env=environ, capture_output=True, timeout=60)
            assert done.returncode == 0, done.stderr
        assert outs[0].read_bytes() == outs[1].read_bytes(), kernel
    assert runs(log) == 2 and _entries(cache) == []


@pytest.mark.slow
def test_a_fifo_is_left_to_the_real_ptxas(tmp_path):
    """A FIFO without a writer: the shim never opens it (an open would wait for a writer
    forever, and a read would take what the real ptxas must get); the real ptxas does, and
    waits, as without the shim, until the site's wrapper stops it."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    log = tmp_path / "runs.log"
    site_bin = tmp_path / "site"
    site_bin.mkdir()
    (site_bin / "ptxas").write_text(f'#!/bin/sh\necho "$@" >> "{log}"\n'
                                    f'exec timeout 2 {triton_ptxas()} "$@"\n')
    (site_bin / "ptxas").chmod(0o755)
    cache = tmp_path / "root" / "ptxas"
    through = assemble(fifo, tmp_path / "o.cubin", shim_environ(cache, site_bin))
    direct = subprocess.run([str(site_bin / "ptxas"), str(fifo), "-o", str(tmp_path / "d.cubin"),
                             "-arch=sm_90a", "--warn-on-spills"], capture_output=True, timeout=60)
    assert through.returncode == direct.returncode == 124  # timeout's: the real ptxas waited for a writer
    assert runs(log) == 2 and _entries(cache) == []


#: Two kernels whose whole PTX fits in a host name (at most 64 bytes): their cubins differ.
TINY_PTX = {name: f".version 8.7\n.target sm_90a\n.address_size 64\n.entry {name}(){{ret;}}" for name in "kj"}
#: Set the host name of a UTS namespace of its own to argv[1], then run ptxas through the shim on
#: /proc/sys/kernel/hostname: a regular file whose size (``fstat``) is 0 and whose content is
#: the name, as a FUSE or other proc file whose size understates what it holds.
IN_OWN_HOSTNAME = (
    "import os, socket, sys\n"
    "socket.sethostname(sys.argv[1])\n"
    "os.execvp('ptxas', ['ptxas', '/proc/sys/kernel/hostname', '-o', sys.argv[2], '-arch=sm_90a',"
    " '--warn-on-spills'])\n")


@pytest.mark.slow
def test_an_input_whose_size_understates_its_content_is_keyed_on_all_of_it(site, tmp_path):
    """The shim reads its input to the end, whatever ``fstat`` says (FACTS: "Pipes report size
    0"): keyed on what ``fstat`` said, both calls would be keyed on nothing, and the second
    kernel would get the first one's cubin."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        unavailable("a UTS namespace of its own needs root and unshare")
    wrapper, log, cache = site
    environ = shim_environ(cache, wrapper.parent)
    for name, text in TINY_PTX.items():
        out = tmp_path / f"{name}.cubin"
        done = subprocess.run(["unshare", "--uts", sys.executable, "-c", IN_OWN_HOSTNAME, text, str(out)],
                              env=environ, capture_output=True, timeout=120)
        assert done.returncode == 0, done.stderr
        plain = tmp_path / f"{name}.ptx"
        plain.write_text(text + "\n")  # (the kernel adds the newline)
        assert out.read_bytes() == _real_output(triton_ptxas(), plain, tmp_path / "real.cubin")
    assert runs(log) == 2
    assert len(_entries(cache)) == 2


@pytest.mark.slow
def test_a_result_is_kept_only_for_the_input_the_real_ptxas_read(ptx, tmp_path):
    log, flag = tmp_path / "runs.log", tmp_path / "rewrite-once"
    site_bin = tmp_path / "site"  # the input changes while ptxas runs (here: just before)
    site_bin.mkdir()
    (site_bin / "ptxas").write_text(f'#!/bin/sh\necho "$@" >> "{log}"\n'
                                    f'if [ -e "{flag}" ] && [ -f "$1" ]; then\n'
                                    f'  rm "{flag}"; cp "{ptx["mm"]}" "$1"\nfi\n'
                                    f'exec {triton_ptxas()} "$@"\n')
    (site_bin / "ptxas").chmod(0o755)
    flag.touch()
    environ = shim_environ(tmp_path / "root" / "ptxas", site_bin)
    for n in range(2):
        source = tmp_path / f"tempfile-{n}"
        shutil.copy(ptx["add"], source)
        assert assemble(source, tmp_path / f"{n}.cubin", environ).returncode == 0
    # the second call is add's, not the mm the first run compiled under add's key
    assert runs(log) == 2
    real = _real_output(triton_ptxas(), ptx["add"], tmp_path / "r.cubin")
    assert (tmp_path / "1.cubin").read_bytes() == real


@pytest.mark.slow
def test_a_wrapper_that_picks_the_release_from_the_environment_gets_that_releases_cubin(ptx, tmp_path):
    homes = {}
    for release, binary in (("12", older_ptxas()), ("13", triton_ptxas())):
        homes[release] = tmp_path / f"cuda-{release}"
        (homes[release] / "bin").mkdir(parents=True)
        (homes[release] / "bin" / "ptxas").symlink_to(binary)
    log = tmp_path / "runs.log"
    site_bin = tmp_path / "site"  # a module system's ptxas: the release the job's CUDA_HOME names
    site_bin.mkdir()
    (site_bin / "ptxas").write_text(f'#!/bin/sh\necho "$@" >> "{log}"\n'
                                    'exec "${CUDA_HOME:-/usr/local/cuda}/bin/ptxas" "$@"\n')
    (site_bin / "ptxas").chmod(0o755)
    cache = tmp_path / "root" / "ptxas"
    outs = []
    for n, release in enumerate(("12", "13", "12")):  # three jobs, one after the other
        environ = shim_environ(cache, site_bin, CUDA_HOME=str(homes[release]))
        outs.append(tmp_path / f"job-{n}.cubin")
        assert assemble(ptx["add87"], outs[-1], environ).returncode == 0
    direct = {r: _real_output(homes[r] / "bin" / "ptxas", ptx["add87"], tmp_path / f"direct-{r}.cubin")
              for r in homes}
    assert direct["12"] != direct["13"]
    assert [p.read_bytes() for p in outs] == [direct["12"], direct["13"], direct["12"]]
    assert runs(log) == 2  # the third job's call was a hit on the first one's entry


# --- issue 38: a damaged entry is never served --------------------------------------------------

def _flip_in_place(path: Path, at: int) -> None:
    """One bit of ``path`` flipped at ``at`` (from the end where negative), written in place,
    its size and times put back (bit rot, a storage fault, a write in place)."""
    info = path.stat()
    data = bytearray(path.read_bytes())
    data[at] ^= 1
    path.write_bytes(bytes(data))
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert path.stat().st_size == info.st_size


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["one bit of the cubin flipped", "an entry of the older format"])
def test_a_damaged_or_older_entry_is_a_miss_set_aside_and_replaced(ptx, site, tmp_path, damage):
    """The shim reads a kept entry whose cubin lost one bit (size and times kept), or one an
    older gpu-cache wrote (no digest): the caller gets the real ptxas's cubin, never the kept
    one; the entry is set aside and the real run's result takes its name; the tally counts it as
    refused. Before that, prune finds the damage and names it."""
    wrapper, log, cache = site
    tally = tmp_path / "tally"
    environ = shim_environ(cache, wrapper.parent, **{names.PTXAS_TALLY_VAR: str(tally)})
    first = assemble(ptx["mm"], tmp_path / "first.cubin", environ)
    assert first.returncode == 0
    (entry,) = _entries(cache)
    if damage == "an entry of the older format":  # gpu-cache ptxas entry 1: no frame, no digest
        body = DIGEST.opened(entry.read_bytes())
        entry.write_bytes(body.replace(SHIM.ENTRY_MAGIC, b"gpu-cache ptxas entry 1\n", 1))
        why = "not an entry of this format (an older gpu-cache's?)"
    else:
        _flip_in_place(entry, -len((tmp_path / "first.cubin").read_bytes()) // 2)
        why = DIGEST.DAMAGED
        pruned = run_cli_here("prune", "--dry-run", "--json", "--cache-root", str(cache.parent))
        removed = json.loads(pruned.stdout)["ptxas"]["removed"]
        assert [(r["key"], r["reason"]) for r in removed] == [(entry.name, f"broken: {why}")]
    held = tmp_path / "held"  # a second link to the entry, so that its inode is not reused
    os.link(entry, held)
    second = assemble(ptx["mm"], tmp_path / "second.cubin", environ)
    real = _real_output(triton_ptxas(), ptx["mm"], tmp_path / "real.cubin")
    assert second.returncode == 0 and second.stderr == first.stderr
    assert (tmp_path / "second.cubin").read_bytes() == real
    assert runs(log) == 2  # the real ptxas ran again
    assert held.stat().st_nlink == 1 and not os.path.samefile(entry, held)  # set aside, replaced
    assert SHIM.unpack_entry(entry.read_bytes(), entry.stem)[2] == real
    assert [p.name for p in cache.iterdir() if p.name.endswith(".aside")] == []
    lines = [line.split("\t") for line in tally.read_text().splitlines()]
    assert [(f[0], f[1], f[6]) for f in lines if f[0] == "refused"] == \
        [("refused", entry.stem, f"{entry.stem} is {why}; set aside")]
    assert [f[0] for f in lines] == ["miss", "refused", "miss"]
