"""torch extensions: what a build's flags hold beyond their text (issue 54). A response file
(``extra_cflags=["@flags.rsp"]``: g++ reads its arguments from the file) is keyed by its
contents, so a changed file builds anew; one the hook cannot read builds as without the hook.
Real ``load_inline`` builds with g++ and ninja, as tests/test_torch_extensions.py runs them
(whose jobs these are; ``-march=native`` in a response file: its native test)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import HOOK, records
from hook_jobs import warnings_in
from test_torch_extensions import JOB_BOUND, KIND, builds, environ, run, start

pytestmark = pytest.mark.slow


def test_a_changed_response_file_builds_anew_and_explain_names_it(tmp_path):
    """``extra_cflags=["@flags.rsp"]`` with ``-DADV_VALUE=1``, then the file changed to ``=2``,
    then back: the second job builds its own entry and answers 2, the third loads the first's,
    and ``doctor --explain`` says a response file changed. Guard: the ``responses`` key part
    (without it: the jobs kept getting the =1 build, [1, 1, 1])."""
    from gpu_cache.commands import explain

    root = tmp_path / "root"
    rsp = tmp_path / "flags.rsp"
    env = environ(tmp_path, root, EXT_CFLAGS=f"-O1 @{rsp}")
    answers = []
    for value in (1, 2, 1):
        rsp.write_text(f"-DADV_VALUE={value}\n")
        answers.append(run(tmp_path, env, "ADV_VALUE"))
    assert [a["answer"] for a in answers] == [1, 2, 1]
    assert answers[0]["file"] == answers[2]["file"] != answers[1]["file"]
    assert [(s["misses"], s["hits"]) for s in records(root, KIND.name)] == [(1, 0), (1, 0), (0, 1)]
    causes = [key for group in explain.account_cache(root)["by_rule"] if group["kind"] == KIND.name
              for cause in group["causes"] for key in cause["keys"]]
    assert [c["changed"] for c in causes] == [[], ["responses"]], causes
    assert causes[1]["causes"][0].startswith("responses: a response file its flags name changed")
    assert len(builds(root)) == 2


@pytest.mark.parametrize("fault", ["larger than the hook reads", "missing"])
def test_a_response_file_the_hook_cannot_key_builds_as_without_the_hook(tmp_path, fault):
    """A response file larger than the 1 MiB the hook reads (g++ reads it whole), or one that is
    missing (g++ leaves the argument as it is, and the build fails without its macro): the job
    does what it does without the hook (it answers 3; or fails with torch's error), with one warning
    line, and nothing is kept under the key. Guard: a response file that cannot be read ends
    the key (``flags.expand`` raises; the piece then calls torch's own ``_jit_compile``). Skipped
    instead, the jobs said nothing, and the large file's build was kept under a key without it."""
    root = tmp_path / "root"
    rsp = tmp_path / "flags.rsp"
    if fault == "missing":
        rsp = tmp_path / "no-such.rsp"
    else:
        rsp.write_text("-DADV_VALUE=3\n" + " " * (1 << 20))
    done = {}
    for how in ("with the hook", "without"):
        env = environ(tmp_path, root if how == "with the hook" else tmp_path / "bare", EXT_CFLAGS=f"@{rsp}")
        if how == "without":
            paths = env["PYTHONPATH"].split(os.pathsep)
            env["PYTHONPATH"] = os.pathsep.join(path for path in paths if path != str(HOOK))
        job = start(tmp_path, env, "ADV_VALUE")
        done[how] = (*job.communicate(timeout=JOB_BOUND), job.returncode)
    (out, err, code), (bare_out, bare_err, bare_code) = done.values()
    assert (code, out.count('"answer": 3')) == (bare_code, bare_out.count('"answer": 3')) \
        == ((1, 0) if fault == "missing" else (0, 1)), err[-3000:]
    if fault == "missing":
        assert "Error building extension 'ext_answer'" in err and "Error building extension" in bare_err
    (warning,) = warnings_in(err)
    assert f"the response file {rsp}" in warning, warning
    assert builds(root) == []


def test_the_response_files_of_every_way_a_flag_names_one_are_read(tmp_path):
    """What g++, nvcc and the linker read as a response file, named in any flag list: ``@f``,
    ``-Xcompiler @f`` and ``-Xcompiler=@f,-O2``, ``-Wl,@f``, nvcc's ``-optf f`` and
    ``--options-file=f``, one named inside another, a relative name (the build folder's);
    and ``-march=native`` inside one. Guard: ``flags.expand``'s forms."""
    from helpers import hook_piece

    flags = hook_piece("kinds.torch_extensions.flags")
    for name, text in {"a": "-DA @b", "b": "-march=native", "c": "-O2", "d": "'-DQ=1 2'", "e": "",
                       "f": "-g", "g": "-lm"}.items():
        (tmp_path / name).write_text(text)
    lists = [[f"@{tmp_path / 'a'}", "-DX=@c"],
             ["-Xcompiler", f"@{tmp_path / 'c'}", f"-Xcompiler=@{tmp_path / 'd'},-O2",
              "-optf", str(tmp_path / "e"), f"--options-file={tmp_path / 'f'}"], [], ["-Wl,@g"]]
    arguments, files = flags.expand(lists, str(tmp_path))
    assert [Path(name).name for name, _digest in files] == ["a", "b", "c", "d", "e", "f", "g"]
    assert "-DQ=1 2" in arguments and "-march=native" in arguments and "-lm" in arguments
    parts, paths = flags.parts(lists, str(tmp_path), lambda native: f"#define N {native}", 32)
    assert set(parts) == {"responses", "native"} and paths[-1] == str(tmp_path / "g")
    (tmp_path / "c").unlink()
    with pytest.raises(OSError, match="cannot read the response file"):
        flags.expand(lists, str(tmp_path))
