"""torch's JIT-built C++ extensions as a cache kind (issue 38): real ``load_inline`` builds with
g++ and ninja on CPU, in jobs with gpu-cache's environment. Four jobs on an empty root build
once; a builder killed while g++ runs stalls no later job; a job on another root fed by
pack -> unpack builds nothing; changed sources, or a changed header, build anew; a torn build
is never loaded. (The kind's generic faults and attacks: tests/test_kind_contract.py.)"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flight_jobs import has_open, job_env
from gpu_cache.core.kinds import torch_extensions
from helpers import hook_source, records, run_cli

pytest.importorskip("torch")
KIND = torch_extensions.KIND
#: An extension in plain C++ (no torch headers: it builds in a second), whose ``answer()``
#: returns the number its source holds, and ``#include``s ``answer.h`` where ``HEADER`` is set.
SOURCE = r'''
#include <Python.h>
#ifdef HEADER
#include "answer.h"
#endif
static PyObject* answer(PyObject*, PyObject*) { return PyLong_FromLong(ANSWER); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, ""}, {nullptr, nullptr, 0, nullptr}};
#define STR2(x) #x
#define STR(x) STR2(x)
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, STR(TORCH_EXTENSION_NAME), nullptr, -1, methods};
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
PyMODINIT_FUNC CAT(PyInit_, TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&mod); }
'''
#: One job: ``job.py ANSWER [SYNC] [INCLUDE]``: imports torch's extension loader, says it is
#: ready and waits for the go file (with SYNC), loads the extension, prints what it answers.
JOB = r'''
import json, os, sys, time
answer, sync, include = (sys.argv[1:] + ["", ""])[:3]
from torch.utils import cpp_extension
if sync:
    open(os.path.join(sync, f"ready{os.getpid()}"), "w").close()
    while not os.path.exists(os.path.join(sync, "go")):
        time.sleep(0.002)
source = open(os.environ["EXT_SOURCE"]).read()
flags = ["-DHEADER"] if include else []
source = source if include else source.replace("ANSWER", answer)
module = cpp_extension.load_inline("ext_answer", [source], extra_cflags=flags,
                                   extra_include_paths=[include] if include else None,
                                   no_implicit_headers=True)
print(json.dumps({"answer": module.answer(), "file": module.__file__}))
'''
#: A C++ compiler that sleeps before each compile while its mark file exists (saying so in
#: ``<mark>.compiling``): a build that is still in g++ when its job is killed.
SLOW_CXX = '''#!/bin/sh
case " $* " in *" -c "*) if [ -e "$SLOW_MARK" ]; then touch "$SLOW_MARK.compiling"; sleep 120; fi;; esac
exec g++ "$@"
'''
#: Longest a job may take here (torch's import and a build of SOURCE take a few seconds).
JOB_BOUND = 90.0

def environ(tmp_path: Path, root: Path, **extra: str) -> dict[str, str]:
    (tmp_path / "job.py").write_text(JOB)
    (tmp_path / "ext.cpp").write_text(SOURCE)
    return job_env(root, EXT_SOURCE=str(tmp_path / "ext.cpp"), **extra)


def start(tmp_path: Path, env: dict[str, str], *args: str, **popen: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(tmp_path / "job.py"), *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


def result(job: subprocess.Popen[str], timeout: float = JOB_BOUND) -> dict:
    try:
        out, err = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        job.kill()  # (a job stalled for ever: none is left behind)
        job.communicate()
        raise
    assert job.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def run(tmp_path: Path, env: dict[str, str], *args: str) -> dict:
    return result(start(tmp_path, env, *args))


def builds(root: Path) -> list[str]:
    """The whole keyed builds under ``root``, by key."""
    return sorted(e.key for e in KIND.scan(KIND.folder(root)) if e.problem is None and KIND.compiled([e.key]))


@pytest.mark.slow
def test_four_jobs_on_an_empty_root_build_once(tmp_path):
    """Four jobs load one extension at one instant: one builds it, three wait for its entry
    and load it. Guard: single-flight (``gpu_cache_hook.flight.lead``) in the piece's ``serve``."""
    root = tmp_path / "root"
    env = environ(tmp_path, root)
    sync = tmp_path / "sync"
    sync.mkdir()
    jobs = [start(tmp_path, env, "42", str(sync)) for _ in range(4)]
    deadline = time.monotonic() + JOB_BOUND
    while len(list(sync.glob("ready*"))) < 4 and time.monotonic() < deadline:
        assert all(job.poll() is None for job in jobs), [job.communicate() for job in jobs]
        time.sleep(0.01)
    (sync / "go").touch()
    done = [result(job) for job in jobs]
    assert {d["answer"] for d in done} == {42} and len({d["file"] for d in done}) == 1
    sections = records(root, KIND.name)
    assert [sum(s[field] for s in sections) for field in ("misses", "hits", "waited")] == [1, 3, 3], sections
    assert builds(root) == [Path(done[0]["file"]).parent.name]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["node", "cluster"])
def test_a_builder_killed_in_g_plus_plus_stalls_no_later_job(tmp_path, mode):
    """A job killed (its whole process group, SIGKILL) while g++ builds, with another job waiting
    for that build: the waiter builds it itself within the bound, where torch's own ``lock``
    file would hold it (and every later job) for ever; what the killed build left is no entry.
    In cluster mode the waiter passes the dead builder's lease. Guard: the piece's wrap of
    ``_jit_compile`` (no ``FileBaton``) and single-flight's lock of a dead process."""
    root = tmp_path / "root"
    (tmp_path / "bin").mkdir()
    cxx = tmp_path / "bin" / "g++"
    cxx.write_text(SLOW_CXX)
    cxx.chmod(0o755)
    mark = tmp_path / "slow"
    mark.touch()
    env = environ(tmp_path, root, CXX=str(cxx), SLOW_MARK=str(mark), GPU_CACHE_LOCK_MODE=mode)
    builder = start(tmp_path, env, "42", start_new_session=True)
    waiter = None
    try:
        deadline = time.monotonic() + JOB_BOUND
        while not Path(f"{mark}.compiling").exists():
            assert builder.poll() is None and time.monotonic() < deadline, builder.communicate()
            time.sleep(0.05)
        waiter = start(tmp_path, env, "42")
        locks, waiting = root / "locks" / KIND.name, time.monotonic() + 20
        while not any(has_open(waiter.pid, lock) for lock in locks.glob("*.lock")):  # waits for the build
            assert waiter.poll() is None, waiter.communicate()
            if time.monotonic() > waiting:
                break  # (no lock of gpu-cache's: it waits on what torch left, if anything)
            time.sleep(0.05)
        os.killpg(builder.pid, signal.SIGKILL)
        builder.communicate()
        mark.unlink()
        killed = time.monotonic()
        assert result(waiter)["answer"] == 42
        assert time.monotonic() - killed < JOB_BOUND
    finally:  # (nothing left behind by a failure)
        if builder.poll() is None:
            os.killpg(builder.pid, signal.SIGKILL)
            builder.communicate()
        if waiter is not None and waiter.poll() is None:
            waiter.kill()
            waiter.communicate()
    (section,) = records(root, KIND.name)
    assert (section["misses"], section["hits"]) == (1, 0)
    left = [e for e in KIND.scan(KIND.folder(root), grace_seconds=0.0) if e.name == "(temporary)"]
    assert len(left) == 1 and "never finished" in left[0].problem  # pruned once past the grace period
    assert len(builds(root)) == 1 and [e.key for e in KIND.scan(KIND.folder(root)) if e.problem] == []


@pytest.mark.slow
def test_a_job_on_a_root_fed_by_pack_and_unpack_builds_nothing(tmp_path):
    """A build packed on one root and unpacked into an empty one (another node's): a job there
    loads it, builds nothing. Guard: the kind's carry (``carry_entries``/``carry_writers``), its key
    free of the root's path."""
    first, second = tmp_path / "first", tmp_path / "second"
    assert run(tmp_path, environ(tmp_path, first), "42")["answer"] == 42
    archive = tmp_path / "builds.tar.gz"
    packed = run_cli("pack", "--json", "--kind", KIND.name, "--cache-root", str(first), str(archive))
    assert packed.returncode == 0, packed.stderr
    assert json.loads(packed.stdout)["entries"] == {KIND.name: 1}
    unpacked = run_cli("unpack", "--cache-root", str(second), str(archive))
    assert unpacked.returncode == 0, unpacked.stderr
    done = run(tmp_path, environ(tmp_path, second), "42")
    assert done["answer"] == 42 and Path(done["file"]).is_relative_to(second)
    (section,) = records(second, KIND.name)
    assert (section["hits"], section["misses"]) == (1, 0)
    assert builds(second) == builds(first)


@pytest.mark.slow
def test_changed_sources_build_into_another_entry_and_explain_names_them(tmp_path):
    """Sources that answer 43 after a build of those that answer 42: a second entry beside the
    first (which a later job still loads), and ``doctor --explain`` says the sources changed.
    Guard: the sources' contents in the key."""
    from gpu_cache.commands import explain

    root = tmp_path / "root"
    env = environ(tmp_path, root)
    files = [run(tmp_path, env, answer) for answer in ("42", "43", "42")]
    assert [f["answer"] for f in files] == [42, 43, 42]
    assert files[0]["file"] == files[2]["file"] != files[1]["file"]
    assert builds(root) == sorted(Path(f["file"]).parent.name for f in files[:2])
    assert [(s["misses"], s["hits"]) for s in records(root, KIND.name)] == [(1, 0), (1, 0), (0, 1)]
    causes = [key for group in explain.account_cache(root)["by_rule"] if group["kind"] == KIND.name
              for cause in group["causes"] for key in cause["keys"]]
    assert [c["changed"] for c in causes] == [[], ["sources"]], causes
    assert causes[1]["causes"][0].startswith("sources: its sources changed")


@pytest.mark.slow
def test_a_changed_header_builds_anew(tmp_path):
    """An extension that includes a header from its include path: after the header changes
    (sources and flags the same, so the same key), the next job builds again, in place of the
    stale entry, and loads what the new header says. Guard: the headers of the manifest
    checked before an entry is served."""
    root = tmp_path / "root"
    env = environ(tmp_path, root)
    include = tmp_path / "include"
    include.mkdir()
    (include / "answer.h").write_text("#define ANSWER 42\n")
    first = run(tmp_path, env, "0", "", str(include))
    (include / "answer.h").write_text("#define ANSWER 43\n")
    second = run(tmp_path, env, "0", "", str(include))
    assert (first["answer"], second["answer"]) == (42, 43) and first["file"] == second["file"]
    stale = records(root, KIND.name)[1]["missed"][0]["why"]
    assert stale == f"a header it includes changed: {include / 'answer.h'}"
    assert len(builds(root)) == 1


@pytest.mark.slow
def test_a_torn_build_is_never_loaded(tmp_path):
    """An entry whose library was cut short (a full disk, a copy that stopped): the next job
    builds it again and loads the new one. Guard: the library's size and digest checked before
    an entry is served."""
    root = tmp_path / "root"
    env = environ(tmp_path, root)
    library = Path(run(tmp_path, env, "42")["file"])
    with open(library, "r+b") as stream:
        stream.truncate(library.stat().st_size // 2)
    assert run(tmp_path, env, "42")["answer"] == 42
    assert records(root, KIND.name)[1]["missed"][0]["why"] == "its library is not as built"
    assert len(builds(root)) == 1 and [e.key for e in KIND.scan(KIND.folder(root)) if e.problem] == []


@pytest.mark.parametrize("name", ["MANIFEST"])
def test_the_pieces_names_are_the_kinds(name):
    """The hook's piece and the kind agree on the names they share (the hook imports nothing of
    the package)."""
    tree = ast.parse(hook_source("kinds.torch_extensions").read_text())
    found = {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
             for t in node.targets if isinstance(node.value, ast.Constant) and hasattr(t, "id")}
    assert found[name] == getattr(torch_extensions, name)
    head = hook_source("kinds.torch_extensions").read_text().split('"""')[0]  # its declared facts
    assert found["KIND"] == KIND.name and f"# watches {KIND.watched_module}\n" in head
