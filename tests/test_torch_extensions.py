"""torch's JIT-built C++ extensions as a cache kind (issue 38): real ``load_inline`` builds with
g++ and ninja on CPU, in jobs with gpu-cache's environment. Four jobs on an empty root build
once; a builder killed while g++ runs stalls no later job; a job on another root fed by
pack -> unpack builds nothing; changed sources, or a changed header, build anew; a torn build
is never loaded. Attacks and mistakes (issue 46), with a real second user (``private_user``),
real include and library folders: another account's folder of the name, or of the kind, is
never built in nor served from; another library's headers or archive build another entry; a
library of another build or of another account is never loaded; a source or header changed
during the build is not kept. (The kind's generic faults and attacks: tests/test_kind_contract.py.)"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import pwd
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flight_jobs import has_open, job_env
from gpu_cache.core.kinds import torch_extensions
from helpers import clean_environ, records, run_cli

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
#: ``load_inline`` of ``$EXT_SOURCE`` (ANSWER replaced), or with ``$EXT_LOAD`` ``load`` of that
#: file as it is; ``$EXT_CFLAGS`` and ``$EXT_LDFLAGS``: its extra compile and link flags; with
#: ``$EXT_AGAIN`` it loads it twice; ``$EXT_BUILD_DIR``: its ``build_directory``.
JOB = r'''
import json, os, sys, time
answer, sync, include = (sys.argv[1:] + ["", ""])[:3]
from torch.utils import cpp_extension
if sync:
    open(os.path.join(sync, f"ready{os.getpid()}"), "w").close()
    while not os.path.exists(os.path.join(sync, "go")):
        time.sleep(0.002)
flags = (["-DHEADER"] if include else []) + os.environ.get("EXT_CFLAGS", "").split()
ldflags, folder = os.environ.get("EXT_LDFLAGS", "").split(), os.environ.get("EXT_BUILD_DIR")
for _ in range(2 if os.environ.get("EXT_AGAIN") else 1):
    if os.environ.get("EXT_LOAD"):
        module = cpp_extension.load("ext_answer", [os.environ["EXT_LOAD"]], extra_ldflags=ldflags)
    else:
        source = open(os.environ["EXT_SOURCE"]).read()
        source = source if include else source.replace("ANSWER", answer)
        module = cpp_extension.load_inline("ext_answer", [source], extra_cflags=flags, extra_ldflags=ldflags,
                                           extra_include_paths=[include] if include else None,
                                           no_implicit_headers=True, build_directory=folder)
    print(json.dumps({"answer": module.answer(), "file": module.__file__}))
'''
#: A C++ compiler that sleeps before each compile while its mark file exists (saying so in
#: ``<mark>.compiling``): a build that is still in g++ when its job is killed.
SLOW_CXX = '''#!/bin/sh
case " $* " in *" -c "*) if [ -e "$SLOW_MARK" ]; then touch "$SLOW_MARK.compiling"; sleep 120; fi;; esac
exec g++ "$@"
'''
#: A C++ compiler that, for the first compile after ``$ACT_MARK`` is made, writes the owner and
#: mode of the folder it compiles in to ``<mark>.cwd`` and runs ``$ACT_BEFORE`` before g++ and
#: ``$ACT_AFTER`` after it: whatever another account, or an editor, does while a build runs.
ACT_CXX = '''#!/bin/sh
case " $* " in *" -c "*) if [ -e "$ACT_MARK" ]; then
  rm -f "$ACT_MARK"; stat -c '%u %a' . > "$ACT_MARK.cwd"
  sh -c "${ACT_BEFORE:-:}"; g++ "$@"; rc=$?; sh -c "${ACT_AFTER:-:}"; exit $rc
fi;; esac
exec g++ "$@"
'''
#: g++ on a CPU of the kind ``$HOST_MARCH`` names: a ``-march=native`` build is one for that
#: CPU (x86-64-v3 has AVX2; x86-64, an older CPU's, not), also where a response file holds it.
HOST_CXX = '''#!/bin/sh
for a do
  shift
  case "$a" in @*) set -- "$@" $(sed "s/-march=native/-march=$HOST_MARCH/" "${a#@}"); continue;; esac
  [ "$a" = -march=native ] && a="-march=$HOST_MARCH"
  set -- "$@" "$a"
done
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


def acting_cxx(tmp_path: Path, before: str = "", after: str = "") -> dict[str, str]:
    """The variables of a job whose first compile runs ``before`` and ``after`` (ACT_CXX)."""
    cxx = tmp_path / "act" / "g++"
    cxx.parent.mkdir(exist_ok=True)
    cxx.write_text(ACT_CXX)
    cxx.chmod(0o755)
    (tmp_path / "act" / "mark").touch()
    return {"CXX": str(cxx), "ACT_MARK": str(tmp_path / "act" / "mark"), "ACT_BEFORE": before,
            "ACT_AFTER": after}


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
    loads it, builds nothing. Guard: the kind's carry (``entries``/``writers``), its key
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


# --- issue 46: only the code the job asked for, built where no one else can write -------------


def as_user(user: str, *command: str) -> None:
    done = subprocess.run(["runuser", "-u", user, "--", *command], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr  # the attack is real: that account can do it


@pytest.mark.slow
def test_another_accounts_folder_of_the_name_is_never_built_in_nor_served(tmp_path, base, private_user):
    """``<kind>/ext_answer``, torch's own folder of the name (where ``load_inline`` writes the
    sources it builds), is another account's: it appeared after env checked the root, and that
    account swaps ``main.cpp`` in it for one that answers 666 as soon as g++ starts. The job
    builds in a folder only its user can write, answers 41, and so does the next job (a hit);
    nothing is built in that account's folder. Guard: the piece's ``_get_build_directory``,
    which hands torch a new 0700 folder instead of ``<folder>/<name>`` (reverted: both jobs
    answered 666)."""
    root = base / "root"
    evil = base / "evil.cpp"
    evil.write_text(SOURCE.replace("ANSWER", "666"))
    theirs = root / KIND.name / "ext_answer"
    env = environ(tmp_path, root)  # (env finds the root clean)
    theirs.mkdir(parents=True)
    shutil.chown(theirs, private_user, private_user)
    as_user(private_user, "cp", str(evil), str(theirs / "main.cpp"))
    env.update(acting_cxx(tmp_path, before=f"runuser -u {private_user} -- cp {evil} {theirs}/main.cpp"))
    first, second = run(tmp_path, env, "41"), run(tmp_path, env, "41")
    assert (first["answer"], second["answer"]) == (41, 41) and first["file"] == second["file"]
    assert (tmp_path / "act" / "mark.cwd").read_text().split() == [str(os.getuid()), "700"]
    assert sorted(p.name for p in theirs.iterdir()) == ["main.cpp"]
    assert [(s["misses"], s["hits"]) for s in records(root, KIND.name)] == [(1, 0), (0, 1)]


@pytest.mark.slow
def test_one_extension_loaded_twice_in_a_process_is_built_once(tmp_path):
    """``load_inline`` called twice with the same source in one process: torch's versioner
    keeps its version (no ``ext_answer_v1``), so the second call loads the first's entry,
    although each call gets a folder of its own. Guard: the versioner asked with torch's folder
    of the name, not the folder handed out (reverted: a second build, of ext_answer_v1)."""
    root = tmp_path / "root"
    job = start(tmp_path, environ(tmp_path, root, EXT_AGAIN="1"), "41")
    out, err = job.communicate(timeout=JOB_BOUND)
    assert job.returncode == 0, err[-3000:]
    first, second = (json.loads(line) for line in out.strip().splitlines()[-2:])
    assert first == second and first["answer"] == 41
    (section,) = records(root, KIND.name)
    assert (section["misses"], section["hits"]) == (1, 1)
    assert [p.name for p in (root / KIND.name).iterdir()] == [Path(first["file"]).parent.name]


@pytest.mark.slow
def test_a_build_directory_of_the_callers_own_is_built_and_loaded_there_as_without_the_hook(tmp_path):
    """``load_inline(..., build_directory=<a folder of the caller's>)``: torch builds and loads
    there, as without the hook (the second job finds it built), the folder stays where it is with
    the caller's own file in it, and no keyed entry is made of it. Guard: ``_Build.of`` leaves
    alone a folder it did not hand out (mutation M38, such a folder built as a keyed entry: the
    caller's folder was emptied and renamed into the cache)."""
    root, mine = tmp_path / "root", tmp_path / "my build"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    env = environ(tmp_path, root, EXT_BUILD_DIR=str(mine))
    done = [run(tmp_path, env, "41") for _ in range(2)]
    assert [d["answer"] for d in done] == [41, 41] and {Path(d["file"]).parent for d in done} == {mine}
    assert (mine / "notes.txt").read_text() == "mine\n" and (mine / "build.ninja").is_file()
    assert builds(root) == [] and list((root / KIND.name).iterdir()) == []
    assert [(s["misses"], s["hits"]) for s in records(root, KIND.name)] == [(0, 0), (0, 0)]


@pytest.mark.parametrize("what", ["the kind's folder", "a folder of a name"])
@pytest.mark.parametrize("how", ["another account's", "writable by everyone"])
def test_a_folder_of_the_kind_another_account_may_write_is_refused(base, private_user, what, how):
    """env refuses the kind's folder (the job gets a node-local one) where it, or a folder at its
    top, is another account's or writable by everyone: a job without the startup hook builds
    in ``<kind>/<name>``. Guard: the kind's ``inner`` (reverted: the two cases of a folder
    inside it were exported)."""
    root = base / "root"
    folder = root / KIND.name
    planted = {"the kind's folder": folder, "a folder of a name": folder / "ext_answer"}[what]
    planted.mkdir(parents=True)
    if how == "another account's":
        shutil.chown(planted, private_user, private_user)
        as_user(private_user, "touch", str(planted / "main.cpp"))
    else:
        planted.chmod(0o777)
    done = run_cli("env", "--json", "--cache-root", str(root), env=clean_environ())
    assert done.returncode == 0, done.stderr
    exported = json.loads(done.stdout)
    assert exported["exports"][KIND.env_var] != str(folder)
    why = "owned by" if how == "another account's" else "world-writable"
    assert str(planted) in exported["problems"][KIND.name] and why in exported["problems"][KIND.name]


@pytest.mark.slow
def test_a_kind_folder_another_account_took_is_not_built_in(tmp_path, base, private_user):
    """The kind's folder became another account's after env checked it: the job builds in a
    private folder of its own (and says so), answers right, and leaves nothing in that folder.
    Guard: the kind folder's owner check in ``_hand_out`` (reverted: the build was placed there)."""
    root = base / "root"
    env = environ(tmp_path, root)
    shutil.chown(root / KIND.name, private_user, private_user)
    job = start(tmp_path, env, "41")
    assert result(job)["answer"] == 41
    assert list((root / KIND.name).iterdir()) == []
    (section,) = records(root, KIND.name)
    assert f"{root / KIND.name} is owned by uid {pwd.getpwnam(private_user).pw_uid}" in section["refused"]


def library_folders(tmp_path: Path, var: str) -> tuple[Path, Path, str]:
    """Folders "libfoo 1" and "libfoo 2", each with the ``foo.h`` (FOO) or the archive
    ``libfoo.a`` (``foo()``) of its version; the source that answers what it finds."""
    for version in (1, 2):
        folder = tmp_path / f"libfoo {version}"
        folder.mkdir()
        (folder / "foo.h").write_text(f"#define FOO {version}\n")
        (folder / "foo.cpp").write_text(f'extern "C" long foo(void) {{ return {version}; }}\n')
        subprocess.run(["g++", "-fPIC", "-c", "foo.cpp", "-o", "foo.o"], cwd=folder, check=True)
        subprocess.run(["ar", "rcs", "libfoo.a", "foo.o"], cwd=folder, check=True)
    if var == "LIBRARY_PATH":
        return tmp_path / "libfoo 1", tmp_path / "libfoo 2", 'extern "C" long foo(void);\n' + SOURCE
    return tmp_path / "libfoo 1", tmp_path / "libfoo 2", "#include <foo.h>\n" + SOURCE


@pytest.mark.slow
@pytest.mark.parametrize("var", ["CPLUS_INCLUDE_PATH", "CPATH", "LIBRARY_PATH"])
def test_a_job_built_against_another_library_version_builds_its_own(tmp_path, var):
    """A job compiled with ``var`` naming "libfoo 2" after one with "libfoo 1" (sources and
    flags the same): it builds its own entry and answers 2; a later "libfoo 1" job loads the
    first build. Guard: the compiler's search paths (``COMPILER_VARS``) in the key (reverted:
    the "libfoo 2" job answered 1)."""
    root = tmp_path / "root"
    one, two, source = library_folders(tmp_path, var)
    env = environ(tmp_path, root, EXT_LDFLAGS="-lfoo" if var == "LIBRARY_PATH" else "")
    (tmp_path / "ext.cpp").write_text(source)
    answer = "foo()" if var == "LIBRARY_PATH" else "FOO"
    done = [run(tmp_path, {**env, var: str(folder)}, answer)["answer"] for folder in (one, two, one)]
    assert done == [1, 2, 1]
    sections = records(root, KIND.name)
    assert [(s["misses"], s["hits"]) for s in sections] == [(1, 0), (1, 0), (0, 1)]
    assert json.loads(sections[1]["missed"][0]["parts"]["paths"]) == {var: str(two)}


@pytest.mark.slow
@pytest.mark.parametrize("where", ["extra_cflags", "extra_ldflags", "a response file"])
def test_a_native_build_for_one_cpu_is_never_served_on_another(tmp_path, where):
    """``-march=native`` on a CPU with AVX2 makes code an older CPU cannot run (SIGILL): a job
    on a CPU without AVX2 builds its own entry (it answers 1, not the AVX2 build's 2), a job on
    the first kind of CPU loads the first, and ``doctor --explain`` names the part. The same for
    the flag at link time (``-flto``: the code is made there), and in a response file that
    ``extra_cflags`` names (``@native.rsp``). Guard: the ``native`` key part (the macros the
    compiler defines with ``-march=native`` here), from every flag list and response file
    (without the files: the third case answered [2, 2, 2])."""
    from gpu_cache.commands import explain

    if platform.machine() != "x86_64" or " avx2 " not in Path("/proc/cpuinfo").read_text():
        pytest.skip("runs x86-64-v3 code (AVX2)")
    cxx = tmp_path / "host" / "g++"
    cxx.parent.mkdir()
    cxx.write_text(HOST_CXX)
    cxx.chmod(0o755)
    root = tmp_path / "root"
    (tmp_path / "native.rsp").write_text("-O2\n-march=native\n")
    flags = {"extra_cflags": {"EXT_CFLAGS": "-O2 -march=native"},
             "extra_ldflags": {"EXT_CFLAGS": "-O2 -flto", "EXT_LDFLAGS": "-flto -march=native"},
             "a response file": {"EXT_CFLAGS": f"@{tmp_path / 'native.rsp'}"}}[where]
    env = environ(tmp_path, root, CXX=str(cxx), **flags)
    wide = "#ifdef __AVX2__\n#define WIDE 2\n#else\n#define WIDE 1\n#endif\n"
    (tmp_path / "ext.cpp").write_text(wide + SOURCE)
    files = [run(tmp_path, dict(env, HOST_MARCH=cpu), "WIDE") for cpu in ("x86-64-v3", "x86-64", "x86-64-v3")]
    if where != "extra_ldflags":  # (at link time the macro is not seen: the code is)
        assert [f["answer"] for f in files] == [2, 1, 2]
    assert files[0]["file"] == files[2]["file"] != files[1]["file"]
    assert [(s["misses"], s["hits"]) for s in records(root, KIND.name)] == [(1, 0), (1, 0), (0, 1)]
    causes = [key for group in explain.account_cache(root)["by_rule"] if group["kind"] == KIND.name
              for cause in group["causes"] for key in cause["keys"]]
    assert [c["changed"] for c in causes] == [[], ["native"]], causes


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A root with two builds of ``ext_answer``, one answering 41 and one 666: (the root, the
    first's library, the second's)."""
    where = tmp_path_factory.mktemp("two builds")
    root = where / "root"
    env = environ(where, root)
    first, second = (Path(run(where, env, answer)["file"]) for answer in ("41", "666"))
    shutil.rmtree(root / "records")
    return root, first, second


@pytest.mark.slow
@pytest.mark.parametrize("how", ["damaged at the same size", "another account's folder",
                                 "another account's library"])
def test_another_builds_library_in_an_entry_is_never_loaded(tmp_path, two_builds, private_user, how):
    """The entry of the build that answers 41 holds the library of the one that answers 666, of
    the same size: put there by damage (its manifest unchanged), or by another account that owns
    the entry's folder or its library (and wrote a manifest to match). The job builds again and
    answers 41. Guards: the library's SHA-256, the folder's owner and the library's owner
    checked in the piece's ``whole()`` (each reverted: the job answered 666)."""
    template, first, second = two_builds
    root = tmp_path / "root"
    shutil.copytree(template, root, symlinks=True)
    env = environ(tmp_path, root)  # (env finds the root clean)
    entry = root / KIND.name / first.parent.name
    library = entry / first.name
    assert library.stat().st_size == second.stat().st_size  # (so only the digest tells them apart)
    shutil.copyfile(second, library)
    if how != "damaged at the same size":
        manifest = json.loads((entry / torch_extensions.MANIFEST).read_text())
        manifest["sha256"] = hashlib.sha256(library.read_bytes()).hexdigest()
        (entry / torch_extensions.MANIFEST).write_text(json.dumps(manifest))
        shutil.chown(entry if how == "another account's folder" else library, private_user, private_user)
    assert run(tmp_path, env, "41")["answer"] == 41
    why = {"damaged at the same size": "its library is not as built",
           "another account's folder": "the entry's folder is not trusted (owned by uid",
           "another account's library": "its library is owned by uid"}[how]
    assert records(root, KIND.name)[0]["missed"][0]["why"].startswith(why)


@pytest.mark.slow
@pytest.mark.parametrize("what", ["source", "header"])
def test_a_file_changed_while_it_builds_is_not_kept(tmp_path, what):
    """A ``load()`` source swapped for one that answers 666 while g++ compiles it, then put back
    (as an attacker who can write it would, or an editor's undo); or a header changed right
    after g++ read it. What was compiled is not what the key and manifest say, so the build is
    loaded but not kept, and the next job builds what the files say. Guard: ``_seal``'s check of
    the times of the sources and headers against the key's (reverted: the next job answered
    the first's 666, or 42 for the header's 43)."""
    root = tmp_path / "root"
    env = environ(tmp_path, root)
    source, include = tmp_path / "answer.cpp", tmp_path / "include"
    if what == "source":
        source.write_text(SOURCE.replace("ANSWER", "41"))
        (tmp_path / "evil.cpp").write_text(SOURCE.replace("ANSWER", "666"))
        env.update(EXT_LOAD=str(source), **acting_cxx(tmp_path, before=f"cp {tmp_path}/evil.cpp {source}",
                                                      after=f"cp {tmp_path}/good.cpp {source}"))
        shutil.copyfile(source, tmp_path / "good.cpp")
        args, answers = ("41",), [666, 41]
    else:
        include.mkdir()
        (include / "answer.h").write_text("#define ANSWER 42\n")
        env.update(acting_cxx(tmp_path, after=f"echo '#define ANSWER 43' > {include}/answer.h"))
        args, answers = ("0", "", str(include)), [42, 43]
    assert [run(tmp_path, env, *args)["answer"] for _ in range(2)] == answers
    sections = records(root, KIND.name)
    assert [(s["misses"], s["hits"]) for s in sections] == [(1, 0), (1, 0)]
    changed = source if what == "source" else include / "answer.h"
    assert sections[0]["missed"][0]["not_kept"] == f"{changed} changed while it was built"
    assert len(builds(root)) == 1


@pytest.mark.parametrize("age", [7200.0, 0.0])
def test_a_stale_filebaton_lock_is_pruned_and_a_fresh_one_kept(tmp_path, age):
    """torch's own folder of a name with a ``lock`` its ``FileBaton`` left: older than the grace
    period, every job without the hook would wait on it for ever, so stats calls it broken and
    prune removes the folder; a fresh one is a build under way, kept. Guard: the age check in
    the kind's ``_baton_left`` (inverted: the stale one kept and the fresh one removed)."""
    root = tmp_path / "root"
    folder = root / KIND.name / "ext_answer"
    folder.mkdir(parents=True)
    (folder / "main.cpp").write_text(SOURCE)
    (folder / torch_extensions.BATON).touch()
    when = time.time() - age
    os.utime(folder / torch_extensions.BATON, (when, when))
    (entry,) = KIND.scan(KIND.folder(root))
    assert (entry.problem is not None) == bool(age)
    done = run_cli("prune", "--json", "--cache-root", str(root), "--kind", KIND.name, env=clean_environ())
    assert done.returncode == 0, done.stderr
    assert folder.exists() == (not age)
