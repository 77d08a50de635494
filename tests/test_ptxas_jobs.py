"""The ptxas cache in jobs (issue 34): the startup hook puts the shim first on a job process's
own PATH (also in a container, whose PATH is the image's), the record counts its hits and
misses, doctor says which ptxas XLA and jaxlib run, explain says why a call missed, and stats
and prune see its entries."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_cache.config.settings import settings_from
from gpu_cache.core import names
from gpu_cache.core.kinds import ptxas_explain as explain_ptxas
from gpu_cache.core.kinds import ptxas_format as ptxas_cache
from gpu_cache.jobenv import env
from helpers import HOOK, SCRIPTS, clean_environ, records, run_cli
from ptxas_fixtures import SHIM, SHIM_DIR, make_ptx, runs, site_wrapper, triton_ptxas

#: A job process: what the lead checks (issue 34), from inside it after ``import jax``: the
#: ``ptxas`` on its own PATH runs the real one once for the same PTX under another file name,
#: and again for other PTX, with outputs identical to the real ptxas's. The calls come from
#: shells the job starts: the process's own calls are XLA's or jaxlib's, and only jaxlib's
#: kernels are cached (issue 37; ``test_xlas_own_calls_never_start_python...``).
JOB = r"""
import json, os, shutil, subprocess, sys
import jax
folder, same, other = sys.argv[1:4]
found = shutil.which("ptxas")
outs = []
for n, ptx in enumerate([same, same, other]):
    name = os.path.join(folder, f"tempfile-{os.getpid()}-{n}")
    shutil.copy(ptx, name)
    subprocess.run(["sh", "-c", '"$0" "$@"; exit $?', found, name, "-o", name + ".cubin", "-arch=sm_90a",
                    "--warn-on-spills"], check=True)
    outs.append(name + ".cubin")
subprocess.run(["sh", "-c", f'ptxas "{same}" -o "{folder}/from-a-shell.cubin" -arch=sm_90a --warn-on-spills'],
               check=True)
print(json.dumps({"which": found, "path": os.environ["PATH"].split(os.pathsep)[:2], "outs": outs}))
"""


@pytest.fixture(scope="module")
def ptx(tmp_path_factory) -> dict[str, Path]:
    return make_ptx(tmp_path_factory.mktemp("ptx"))


def job_environ(root: Path, *first_on_path: Path, **config) -> dict[str, str]:
    """A job's environment under ``gpu-cache env`` on ``root``, with ``first_on_path`` (a site's
    ptxas) first on the PATH it starts with."""
    base = clean_environ()
    base["PATH"] = os.pathsep.join([*map(str, first_on_path), base.get("PATH", os.defpath)])
    exports = env.resolve(settings_from(config, cache_root=str(root)), base)
    environ = env.job_environ(exports, base)
    environ["PYTHONPATH"] = os.pathsep.join([environ["PYTHONPATH"], str(SCRIPTS)])
    return environ


@pytest.mark.slow
def test_in_a_job_the_ptxas_on_path_runs_the_real_one_once_per_ptx(ptx, tmp_path):
    log = tmp_path / "real-runs.log"
    wrapper = site_wrapper(tmp_path / "site", triton_ptxas(), log)
    root = tmp_path / "root"
    environ = job_environ(root, wrapper.parent)
    assert names.PTXAS_VAR in environ and str(HOOK) in environ["PYTHONPATH"]
    done = subprocess.run([sys.executable, "-c", JOB, str(tmp_path), str(ptx["add"]), str(ptx["mm"])],
                          env=environ, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["which"] == str(SHIM_DIR / "ptxas") and seen["path"] == [str(SHIM_DIR), str(wrapper.parent)]
    assert runs(log) == 2  # add once (its second call and the shell's hit), mm once
    for ptx_name, out in (("add", seen["outs"][0]), ("add", seen["outs"][1]), ("mm", seen["outs"][2]),
                          ("add", str(tmp_path / "from-a-shell.cubin"))):
        real = tmp_path / f"real-{ptx_name}.cubin"
        subprocess.run([str(triton_ptxas()), str(ptx[ptx_name]), "-o", str(real), "-arch=sm_90a",
                        "--warn-on-spills"], check=True)
        assert Path(out).read_bytes() == real.read_bytes(), (ptx_name, out)
    (part,) = records(root, "ptxas")
    assert part["state"] == "on" and part["real"] == str(wrapper) and part["found_in"] == "PATH"
    assert (part["hits"], part["misses"]) == (2, 2)  # the shell's call counts in the job's record
    assert sorted(m["name"] for m in part["missed"]) == ["add", "mm"]
    assert all(m["parts"]["ptxas"].endswith("V13.4.59") for m in part["missed"])
    assert not list((root / "records").glob(".ptxas-*.tally"))  # the tally went into the record
    # a second job: every call hits
    again = subprocess.run([sys.executable, "-c", JOB, str(tmp_path), str(ptx["add"]), str(ptx["mm"])],
                           env=environ, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert runs(log) == 2
    assert sorted((p["hits"], p["misses"]) for p in records(root, "ptxas")) == [(2, 2), (4, 0)]
    # a third job, after one bit of mm's kept cubin flipped (size and times kept): mm's call
    # misses, gets the real cubin, and the record says why the entry was refused (issue 38)
    (mm_key,) = [m["key"] for m in part["missed"] if m["name"] == "mm"]
    entry = root / "ptxas" / f"{mm_key}.ptxas"
    info = entry.stat()
    data = bytearray(entry.read_bytes())
    data[-1000] ^= 1  # inside the cubin, the entry's last part
    entry.write_bytes(bytes(data))
    os.utime(entry, ns=(info.st_atime_ns, info.st_mtime_ns))
    third = subprocess.run([sys.executable, "-c", JOB, str(tmp_path), str(ptx["add"]), str(ptx["mm"])],
                           env=environ, capture_output=True, text=True, timeout=300)
    assert third.returncode == 0, third.stderr[-3000:]
    assert runs(log) == 3
    assert Path(json.loads(third.stdout.strip().splitlines()[-1])["outs"][2]).read_bytes() == \
        (tmp_path / "real-mm.cubin").read_bytes()
    (damaged,) = [p for p in records(root, "ptxas") if p["refused"]]
    assert (damaged["hits"], damaged["misses"]) == (3, 1)
    assert damaged["refused"] == [f"{mm_key} is not as it was written (its sha256 differs); set aside"]


@pytest.mark.slow
def test_no_shim_where_jax_triton_is_missing_or_the_cache_is_off(tmp_path):
    show = "import os, json; print(json.dumps([os.environ['PATH'], os.environ.get('GPU_CACHE_PTXAS_REAL')]))"
    off = job_environ(tmp_path / "root", ptxas_cache=False)
    assert names.PTXAS_VAR not in off
    done = subprocess.run([sys.executable, "-c", show], env=off, capture_output=True, text=True, check=True)
    assert json.loads(done.stdout)[0] == off["PATH"]
    # a Python without jax_triton (a virtual environment of its own): its XLA is left alone
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    environ = job_environ(tmp_path / "root")
    done = subprocess.run([str(venv / "bin" / "python"), "-c", show], env=environ, capture_output=True,
                          text=True, check=True)
    assert json.loads(done.stdout) == [environ["PATH"], None]


@pytest.mark.slow
def test_in_a_container_the_hook_puts_the_shim_first_on_the_images_path(container_root, unbound_dir, ptx,
                                                                         tmp_path):
    cuda_bin = tmp_path / "cuda-bin"  # the image's CUDA: Triton's ptxas at /usr/local/cuda/bin
    cuda_bin.mkdir()
    shutil.copy(triton_ptxas(), cuda_bin / "ptxas")
    stub = unbound_dir / "site"  # jax_triton, importable there: jax-triton 0.2 needs Python >= 3.10
    (stub / "jax_triton").mkdir(parents=True)
    (stub / "jax_triton" / "__init__.py").write_text("")
    root = unbound_dir / "cache"
    exports = env.resolve(settings_from({}, cache_root=str(root)), clean_environ())
    environ = container_root.environ(env.job_environ(exports, clean_environ()))
    environ["PYTHONPATH"] = os.pathsep.join([environ["PYTHONPATH"], str(stub)])
    environ["APPTAINER_BIND"] += f",{stub}"
    done = container_root.exec("python3", "-c", JOB, str(tmp_path), str(ptx["add"]), str(ptx["mm"]),
                               env=environ, binds=[f"{cuda_bin}:/usr/local/cuda/bin:ro"])
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["which"] == str(SHIM_DIR / "ptxas") and seen["path"][0] == str(SHIM_DIR)
    (part,) = records(root, "ptxas")
    assert (part["state"], part["real"], part["found_in"]) == ("on", "/usr/local/cuda/bin/ptxas",
                                                               "/usr/local/cuda")
    assert (part["hits"], part["misses"]) == (2, 2)


@pytest.mark.slow
def test_doctor_says_which_ptxas_xla_and_jaxlib_run_and_whether_the_shim_is_first(tmp_path):
    wrapper = site_wrapper(tmp_path / "site", triton_ptxas(), tmp_path / "log")
    environ = clean_environ(PATH=f"{wrapper.parent}:/usr/bin:/bin")
    root = str(tmp_path / "root")
    info = json.loads(run_cli("doctor", "--json", "--cache-root", root, env=environ).stdout)["ptxas"]
    assert info["shim_first"] is True and info["real"] == str(wrapper)
    assert info["jaxlib"] == {"runs": str(SHIM_DIR / "ptxas"), "found_in": "PATH", "shim": True,
                              "real": str(wrapper),
                              "version": "Cuda compilation tools, release 13.4, V13.4.59"}
    # no CUDA wheel and no CUDA_ROOT here: XLA looks on PATH too, and finds the shim
    assert info["xla"]["shim"] is True and "XLA (its own kernels): the shim" in \
        run_cli("doctor", "--cache-root", str(tmp_path / "root"), env=environ).stdout
    # JAX's CUDA root named: XLA takes its ptxas before PATH, and the shim is not in its way
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    (cuda / "bin" / "ptxas").symlink_to(triton_ptxas())
    rooted = json.loads(run_cli("doctor", "--json", "--cache-root", str(tmp_path / "root"),
                                env=dict(environ, CUDA_ROOT=str(cuda))).stdout)["ptxas"]
    assert rooted["xla"]["runs"] == str(cuda / "bin" / "ptxas") and rooted["xla"]["shim"] is False
    assert rooted["jaxlib"]["shim"] is True


def _entry(folder: Path, key: str, parts: tuple[str, ...]) -> None:
    data = SHIM.pack_entry(key, b"", b"", b"cubin", 1.0, SHIM.META_SEP.join(parts))
    (folder / f"{key}.ptxas").write_bytes(data)


def test_explain_names_what_changed_for_the_same_ptx(tmp_path):
    folder = tmp_path / "ptxas"
    folder.mkdir()
    _entry(folder, "1" * 64, ("attn", "release 13.4, V13.4.59", "d" * 16, "<input> -arch sm_90a", "i" * 16))
    entries = explain_ptxas.Entries(folder)
    other_options = {"name": "attn", "key": "2" * 64, "parts": {
        "name": "attn", "ptxas": "release 13.4, V13.4.59", "ptxas_digest": "d" * 16,
        "options": "<input> -arch sm_90a --device-debug", "input": "i" * 16}}
    explained = explain_ptxas.explain_item(other_options, entries)
    assert explained["changed"] == ["options"] and "JAX_TRITON_PTXAS_EXTRA_FLAGS" in explained["causes"][0]
    other_ptxas = dict(other_options, parts=dict(other_options["parts"], options="<input> -arch sm_90a",
                                                 ptxas="release 13.0, V13.0.88", ptxas_digest="e" * 16))
    assert explain_ptxas.explain_item(other_ptxas, entries)["changed"] == ["ptxas", "ptxas_digest"]
    new_ptx = dict(other_options, parts=dict(other_options["parts"], input="j" * 16))
    assert "no entry holds this PTX of attn" in explain_ptxas.explain_item(new_ptx, entries)["causes"][0]
    there = dict(other_options, key="1" * 64)
    assert "in the cache now" in explain_ptxas.explain_item(there, entries)["causes"][0]


def test_stats_counts_and_prune_removes_ptxas_entries_and_what_writers_left(tmp_path):
    root = tmp_path / "root"
    folder = root / "ptxas"
    folder.mkdir(parents=True)
    _entry(folder, "3" * 64, ("k", "v", "d", "o", "i"))
    (folder / f"{'4' * 64}.ptxas").write_bytes(SHIM.ENTRY_MAGIC + b"cut short")
    stale = folder / ".gpu-cache-tmp.host.1.abc"
    stale.write_bytes(b"x")
    os.utime(stale, (1, 1))
    stats = json.loads(run_cli("stats", "--json", "--cache-root", str(root)).stdout)
    assert stats["kinds"]["ptxas"]["entries"] == 3
    pruned = json.loads(run_cli("prune", "--json", "--cache-root", str(root)).stdout)
    assert pruned["ptxas"]["entries_removed"] == 2  # the cut-short entry, the stale temporary file
    assert sorted(p.name for p in folder.iterdir()) == [f"{'3' * 64}.ptxas"]


def test_a_passed_verdict_still_holds_while_its_ptxas_entries_are_there(tmp_path):
    from gpu_cache.core import runner

    root = tmp_path / "root"
    (root / "ptxas").mkdir(parents=True)
    key = "5" * 64
    _entry(root / "ptxas", key, ("k", "v", "d", "o", "i"))
    marker = runner.state_file(root, "passed", "plan")  # where the runner keeps it: read under the trust rule
    runner.save_state(marker, {"gpu_type": "h200", "run_id": "r", "keys": {"ptxas": [key]}})
    assert runner.still_valid(root, marker)  # the next warm step only re-checks
    (root / "ptxas" / f"{key}.ptxas").unlink()  # pruned since: it warms again
    assert not runner.still_valid(root, marker)


def test_doctor_explain_accounts_for_a_jobs_ptxas_misses(tmp_path):
    from gpu_cache.commands import explain

    root = tmp_path / "root"
    (root / "ptxas").mkdir(parents=True)
    (root / "records").mkdir()
    parts = {"name": "attn", "ptxas": "release 13.4, V13.4.59", "ptxas_digest": "d" * 16,
             "options": "<input> -arch sm_80", "input": "i" * 16}
    _entry(root / "ptxas", "6" * 64, (*list(parts.values())[:3], "<input> -arch sm_90a", "i" * 16))
    record = {"version": 1, "time": 1.0, "rule": "predict", "ptxas": {
        "state": "on", "hits": 0, "misses": 1, "missed": [{"name": "attn", "key": "7" * 64, "parts": parts}]}}
    (root / "records" / "1-node-1.json").write_text(json.dumps(record))
    (group,) = explain.account_cache(root)["by_rule"]
    assert (group["rule"], group["kind"], group["misses"]) == ("predict", "ptxas", 1)
    (cause,) = group["causes"]
    (item,) = cause["keys"]
    assert item["changed"] == ["options"] and "-arch" in item["causes"][0]
    assert "attn: changed key parts: options" in explain.render_account(explain.account_cache(root))


#: A job process that lowers one jax-triton kernel for CUDA (jax-triton's Triton compile runs
#: here; JAX_TRITON_DUMP_DIR keeps its PTX), then runs ptxas twice on that PTX, as jaxlib will at
#: the kernel's first launch, and twice on other PTX, as XLA does for its own kernels: all four
#: from this process, with temporary names. The shim's Python is logged (which calls start it).
ROUTE_JOB = r"""
import glob, json, os, shutil, subprocess, sys
import jax, jax.numpy as jnp
import jax_triton as jt
from gpu_cache.workloads.jax_triton_kernels import matmul_kernel
folder, xla_ptx, python = sys.argv[1:4]

def f(a, b):
    return jt.triton_call(a, b, kernel=matmul_kernel, out_shape=jax.ShapeDtypeStruct((128, 128), a.dtype),
                          grid=(2, 2), num_warps=4, num_stages=3, compute_capability=90, M=128, N=128, K=128,
                          BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GELU=False)

spec = jax.ShapeDtypeStruct((128, 128), jnp.float16)
jax.jit(f).trace(spec, spec).lower(lowering_platforms=("cuda",))
(jaxlib_ptx,) = glob.glob(os.path.join(os.environ["JAX_TRITON_DUMP_DIR"], "*", "*.ptx"))
os.environ["GPU_CACHE_PTXAS_PYTHON"] = python
outs = {}
for name, ptx in (("jaxlib", jaxlib_ptx), ("xla", xla_ptx)):
    for n in range(2):
        tmp = os.path.join(folder, f"tempfile-{name}-{n}")
        shutil.copy(ptx, tmp)
        subprocess.run(["ptxas", tmp, "-o", tmp + ".cubin", "-arch=sm_90a", "--warn-on-spills"], check=True)
        outs.setdefault(name, []).append(tmp + ".cubin")
print(json.dumps({"jaxlib_ptx": jaxlib_ptx, "outs": outs}))
"""


@pytest.mark.slow
def test_xlas_own_calls_never_start_python_and_jaxlibs_kernels_are_cached(ptx, tmp_path):
    from test_jax_triton import PLUGIN, needs_jax_triton

    needs_jax_triton()
    log = tmp_path / "real-runs.log"
    wrapper = site_wrapper(tmp_path / "site", triton_ptxas(), log)
    root = tmp_path / "root"
    environ = job_environ(root, wrapper.parent)
    environ["PYTHONPATH"] = os.pathsep.join([environ["PYTHONPATH"], str(PLUGIN)])
    environ["JAX_TRITON_DUMP_DIR"] = str(tmp_path / "dump")
    environ["TMPDIR"] = str(tmp_path)  # where the hook keeps the names of jaxlib's kernels
    starts = tmp_path / "python-starts.log"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\necho "$@" >> "{starts}"\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    done = subprocess.run([sys.executable, "-c", ROUTE_JOB, str(tmp_path), str(ptx["mm"]), str(python)],
                          env=environ, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    # XLA's calls went to the real ptxas at once; jaxlib's kernel started the shim's Python twice
    assert len(starts.read_text().splitlines()) == 2
    assert runs(log) == 3  # jaxlib's kernel once (its second call hit), XLA's kernel both times
    entries = [e for e in ptxas_cache.scan(root / "ptxas", 0.0) if e.key.endswith(".ptxas")]
    assert [e.name for e in entries] == ["matmul_kernel"]
    for name, source in (("jaxlib", seen["jaxlib_ptx"]), ("xla", str(ptx["mm"]))):
        real = tmp_path / f"real-{name}.cubin"
        subprocess.run([str(triton_ptxas()), source, "-o", str(real), "-arch=sm_90a", "--warn-on-spills"],
                       check=True)
        assert [Path(p).read_bytes() for p in seen["outs"][name]] == [real.read_bytes()] * 2, name
    (part,) = records(root, "ptxas")
    assert (part["state"], part["jaxlib_kernels"], part["hits"], part["misses"]) == ("on", 1, 1, 1)
    assert not list(tmp_path.glob("gpu-cache-*-ptxas-kernels-*"))  # the kernel names went at exit
