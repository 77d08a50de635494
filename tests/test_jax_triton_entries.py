"""jax-triton's kept kernels are checked field by field before jaxlib sees them (issue 37): an
entry a first process really wrote, with one field changed (its sha256 made anew, as a writer
that wrote it so would) or one byte of its PTX flipped (size and mtime kept), is a miss in a
second real process, which lowers what a compile lowers, records why and sets the entry aside.
And what changes the compiler's output changes the key: another ptxas release, debug=True."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_cache.core.kinds import jax_triton_format as kernel_cache
from helpers import hook_piece, records, run_cli_here
from test_jax_triton import MATMULS, entries, job_env, lower, needs_jax_triton, warnings

#: One bad field per entry, its sha256 made anew: (what is changed, the field, the value,
#: what the record says). ``result``'s fields are what jaxlib's TritonKernel takes.
NOT_WHOLE = "shared_mem_bytes that is not a whole number"
OTHER_KERNEL = "binary that does not define the kernel it names"
FIELDS = {
    "shared_mem_bytes 'abc'": ("result", "shared_mem_bytes", "abc", NOT_WHOLE),
    "shared_mem_bytes -1": ("result", "shared_mem_bytes", -1, NOT_WHOLE),
    # one byte over what one block may have on sm_90 (227 KiB): jaxlib takes it (a uint32), the
    # launch would fail on the GPU
    "shared_mem_bytes 227 KiB + 1": ("result", "shared_mem_bytes", (227 << 10) + 1, NOT_WHOLE),
    "shared_mem_bytes null": ("result", "shared_mem_bytes", None, NOT_WHOLE),
    "name 7": ("result", "name", 7, "name that is no PTX kernel name"),
    "name ''": ("result", "name", "", "name that is no PTX kernel name"),
    # PTX for sm_90 that defines another kernel than the one jaxlib would launch by this name
    "name of another kernel": ("result", "name", "another_kernel", OTHER_KERNEL),
    "binary junk": ("result", "binary", "junk", "binary that is not PTX"),
    "ttir ''": ("entry", "ttir", "", "has no TTIR"),
}
#: A byte flipped in the PTX: the fields still pass, only the sha256 tells (its frame).
FLIPPED = ("one byte of the PTX flipped", "not as it was written (its sha256 differs)")


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, str]:
    """A cache root whose kernel folder holds the five matmuls a first process compiled, and
    the module that process lowered."""
    needs_jax_triton()
    work = tmp_path_factory.mktemp("written")
    lower(job_env(work / "root"), *MATMULS, module_out=work / "compiled.mlir")
    assert len(entries(work / "root")) == 5
    return work / "root", (work / "compiled.mlir").read_text()


def _copy(root: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "root"
    shutil.copytree(root, copy, symlinks=True)
    shutil.rmtree(copy / "records")
    return copy


def _reseal(path: Path, where: str, field: str, value) -> None:
    store = hook_piece("kinds.jax_triton.store")
    entry = json.loads(hook_piece("digest").opened(path.read_bytes()))
    (entry["result"] if where == "result" else entry)[field] = value
    path.write_bytes(store.sealed(entry))


def _flip(path: Path) -> None:
    """One byte of the PTX changed, the file's size and times kept (bit rot, a write in place)."""
    info = path.stat()
    data = path.read_bytes()
    at = data.index(b".address_size 64") + len(".address_size ")
    path.write_bytes(data[:at] + b"3" + data[at + 1:])
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert path.stat().st_size == info.st_size


def test_the_inventory_reads_what_the_hook_writes_and_finds_a_flipped_byte():
    """The hook writes an entry framed with its sha256 (``gpu_cache_hook.kinds.jax_triton.store.sealed``);
    stats, prune and pack read it with the hook's frame (``_hook/gpu_cache_hook/digest.py``)."""
    store = hook_piece("kinds.jax_triton.store")
    key = "a" * 64
    entry = {"format": kernel_cache.FORMAT, "key": key, "kernel": "k\u00e9\udcff", "module": "m",
             "name": "k", "jax_triton": "0.3.1", "triton": "3.9.0", "target": "sm_90",
             "compile_seconds": 0.125, "parts": {"b": "1", "a": "2"},
             "result": {"binary": "ptx", "name": "k", "shared_mem_bytes": 0, "ttgir": None, "llir": None},
             "ttir": "tt.func"}
    data = store.sealed(entry)
    assert kernel_cache.parsed(data, key) == (json.loads(json.dumps(entry)), None)
    flipped = data.replace(b'"shared_mem_bytes": 0', b'"shared_mem_bytes": 1')
    assert kernel_cache.problem_in(flipped, key) == "not as it was written (its sha256 differs)"


@pytest.mark.slow
@pytest.mark.parametrize("cases", [list(FIELDS)[:5], [*list(FIELDS)[5:], FLIPPED[0]]],
                         ids=["shared_mem_bytes and name", "empty and junk fields, a flipped byte"])
def test_a_kept_kernel_with_a_bad_field_is_a_miss_and_set_aside(written, tmp_path, cases):
    """Five entries, each damaged one way: the second process exits 0 (it raised TypeError in
    jaxlib's TritonKernel, or served the entry), compiles all five and lowers the module a
    compile lowers; the record says why each was refused, and each is set aside and written
    anew."""
    root = _copy(written[0], tmp_path)
    victims = dict(zip(cases, entries(root), strict=True))
    expected = {}
    for case, path in victims.items():
        if case == FLIPPED[0]:
            _flip(path)
            expected[path.name] = FLIPPED[1]
        else:
            where, field, value, said = FIELDS[case]
            _reseal(path, where, field, value)
            expected[path.name] = said
    held = tmp_path / "held"  # a second link to each, so that its inode is not reused
    held.mkdir()
    for path in victims.values():
        os.link(path, held / path.name)
    _summary, done = lower(job_env(root), *MATMULS, module_out=tmp_path / "second.mlir")
    assert (tmp_path / "second.mlir").read_text() == written[1]
    (section,) = records(root, "jax_triton")
    assert (section["hits"], section["misses"]) == (0, 5), section
    refused = {line[:64]: line for line in section["refused"]}
    assert set(refused) == set(expected), section["refused"]
    for key, said in expected.items():
        assert said in refused[key] and refused[key].endswith("; set aside"), refused[key]
    assert warnings(done) == []
    for path in victims.values():  # the refused file is gone; the compile's entry took its name
        assert (held / path.name).stat().st_nlink == 1
        assert not os.path.samefile(path, held / path.name)
        assert kernel_cache.problem_in(path.read_bytes(), path.name) is None
    assert sorted(p.name for p in (root / "jax_triton").iterdir() if p.name.endswith(".aside")) == []


@pytest.mark.slow
def test_prune_and_doctor_fix_remove_a_kept_kernel_with_a_flipped_byte(written, tmp_path):
    """Same-size damage (issue 38): ``prune --dry-run`` names the entry broken, and ``doctor
    --fix`` removes it and says so; the four others stay."""
    root = _copy(written[0], tmp_path)
    victim = entries(root)[0]
    _flip(victim)
    pruned = run_cli_here("prune", "--dry-run", "--json", "--cache-root", str(root))
    removed = json.loads(pruned.stdout)["jax_triton"]["removed"]
    assert [(r["key"], r["reason"]) for r in removed] == [(victim.name, f"broken: {FLIPPED[1]}")]
    fixed = run_cli_here("doctor", "--fix", "--cache-root", str(root))
    assert "fixed: jax_triton: removed 1 broken entries" in fixed.stdout, fixed.stdout
    assert not victim.exists() and len(entries(root)) == 4


@pytest.mark.slow
@pytest.mark.parametrize("bad", ["a bad field", "another user's"])
def test_a_bad_entry_in_the_shared_tier_is_not_fetched_and_is_set_aside(written, tmp_path, bad):
    """With the node-local tier, an entry in the shared root is judged before it is copied
    in (the copy would be this user's): a bad one is a miss, set aside there, and the
    compile's entry promoted in its place."""
    root = _copy(written[0], tmp_path)
    victim = entries(root)[0]
    if bad == "a bad field":
        _reseal(victim, "result", "shared_mem_bytes", "abc")
    elif os.geteuid() == 0:
        os.chown(victim, 65534, 65534)
    else:
        pytest.skip("giving a file to another user needs root")
    environ = job_env(root, {"local_tier": {"mode": "on", "folder": str(tmp_path / "tiers")}})
    _summary, done = lower(environ, *MATMULS, module_out=tmp_path / "second.mlir")
    assert (tmp_path / "second.mlir").read_text() == written[1]
    (section,) = records(root, "jax_triton")
    assert (section["hits"], section["misses"]) == (4, 1)
    assert section["refused"] and "(in the shared tier); set aside" in section["refused"][0]
    assert kernel_cache.problem_in(victim.read_bytes(), victim.name) is None
    assert warnings(done) == []


# --- what changes the compiler's output misses (issue 37 item 7) ------------------------------

def _triton_ptxas() -> tuple[str, str]:
    """Triton's own ptxas (the CUDA 12.9 one it uses below sm_90) and the one it uses for
    sm_90 and newer (``ptxas-blackwell``), as their paths."""
    import triton

    folder = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    return str(folder / "ptxas"), str(folder / "ptxas-blackwell")


@pytest.mark.slow
def test_kernels_lowered_with_another_ptxas_release_miss(written, tmp_path):
    """``TRITON_PTXAS_BLACKWELL_PATH`` at Triton's CUDA 12.9 ptxas, not the 13.4 one the five
    kernels were compiled with: the PTX says another ISA version, so every kernel misses, and
    the key part that changed is the one naming the ptxas."""
    older, newer = _triton_ptxas()
    versions = [subprocess.run([p, "--version"], capture_output=True, text=True, check=True).stdout
                for p in (older, newer)]
    assert versions[0] != versions[1], versions  # two releases, or the test proves nothing
    root = _copy(written[0], tmp_path)
    environ = job_env(root, TRITON_PTXAS_BLACKWELL_PATH=older)
    _summary, done = lower(environ, *MATMULS, module_out=tmp_path / "older.mlir")
    (section,) = records(root, "jax_triton")
    assert (section["hits"], section["misses"]) == (0, 5), section
    assert (tmp_path / "older.mlir").read_text() != written[1]  # another PTX: it had to miss
    first = [kernel_cache.parsed(p.read_bytes(), p.name)[0]["parts"] for p in entries(root)
             if p.name not in section["key_parts"]]
    kept = {parts["specialisation"]: parts for parts in first}  # the five matmuls' own constants
    assert len(kept) == 5
    for parts in section["key_parts"].values():
        before = kept[parts["specialisation"]]
        assert sorted(k for k in before if before[k] != parts[k]) == ["ptxas and target"]
    assert warnings(done) == []


@pytest.mark.slow
def test_a_kernel_run_with_debug_misses_against_one_compiled_without(written, tmp_path):
    """``triton_call(..., debug=True)`` compiles each kernel (Triton's debug options change the
    code, and jax-triton prints each IR), never one kept from a compile without it, nor one
    kept from an earlier debug run: every debug run prints its IR again."""
    root = _copy(written[0], tmp_path)
    program = tmp_path / "debug.py"
    program.write_text(
        "import functools, sys\n"
        "import jax_triton as jt\n"
        "jt.triton_call = functools.partial(jt.triton_call, debug=True)\n"
        "from gpu_cache.workloads import jax_triton_kernels\n"
        "sys.exit(jax_triton_kernels.main(sys.argv[1:]))\n")
    for _run in range(2):
        done = subprocess.run([sys.executable, str(program), "--shape", "256", "--mode", "lower", *MATMULS],
                              env=job_env(root), capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.count("tt.func public @matmul_kernel") >= 5  # each compiled, its IR printed
        assert warnings(done) == []
    for section in records(root, "jax_triton"):
        assert section["hits"] == 0 and section["misses"] + section["not_cached"] == 5, section


def test_jax_triton_04s_result_fields_are_checked_before_jaxlib_sees_them():
    """jax-triton 0.4's CompilationResult: ttgir and llir are always text there, and it adds a
    global scratch buffer (size and alignment, passed to jaxlib > 0.11) and tensor descriptors.
    A whole result is served; each odd field refuses the entry."""
    store = hook_piece("kinds.jax_triton.store")
    ptx = ".version 8.7\n.target sm_90a\n.entry k(\n)\n"
    fields = ("binary", "name", "shared_mem_bytes", "ttgir", "llir", "global_scratch_size",
              "global_scratch_align", "tensordesc_meta")

    def why(**changed):
        result = {"binary": ptx, "name": "k", "shared_mem_bytes": 0, "ttgir": "#ttg", "llir": "; llvm",
                  "global_scratch_size": None, "global_scratch_align": None, "tensordesc_meta": []}
        entry = {"jax_triton": "0.4.1", "ttir": "module {\n  tt.func public @k() {\n  }\n}",
                 "result": {**result, **changed}}
        return store.problem(entry, "0.4.1", fields, "sm_90")

    assert why() is None and why(global_scratch_size=256, global_scratch_align=128) is None
    assert why(ttgir="a\0b") == "has a result field ttgir that is not text"
    assert why(global_scratch_size=-1, global_scratch_align=128).startswith(
        "has a result field global_scratch_size that is not null nor a whole number")
    assert why(global_scratch_size=256) == \
        "has a result field global_scratch_align that is null beside a size"
    assert why(global_scratch_size=256, global_scratch_align=3) == \
        "has a result field global_scratch_align that is not a power of two up to 65536"
    assert why(tensordesc_meta=[{"block_size": [1]}]) == \
        "has a result field tensordesc_meta that is not empty"
