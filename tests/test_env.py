"""The exported cache environment: values, user-set values winning, unusable roots."""

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_cache.config.settings import settings_from
from gpu_cache.core import names
from gpu_cache.core.runner import Command, run_command, shell_command
from gpu_cache.jobenv import env, fs
from helpers import REPO, SCRIPTS, clean_environ, run_cli
from release import fresh_venv


def test_every_kind_gets_an_absolute_folder_under_the_root(cache_root):
    exports = env.resolve(settings_from({}, cache_root=str(cache_root)), {})
    values = exports.values
    assert values["JAX_COMPILATION_CACHE_DIR"] == str(cache_root / "jax")
    assert values["TRITON_CACHE_DIR"] == str(cache_root / "triton")
    assert values["TORCHINDUCTOR_CACHE_DIR"] == str(cache_root / "inductor")
    assert values["CUDA_CACHE_PATH"] == str(cache_root / "cuda")
    assert values["TRITON_HOME"].startswith(str(cache_root))
    assert values["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"
    assert values["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] == "-1"
    assert values["JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"] == "none"
    assert not exports.problems and not exports.kept


def test_xla_caches_is_configurable(cache_root):
    exports = env.resolve(settings_from({"xla_caches": "all"}, cache_root=str(cache_root)), {})
    assert exports.values["JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"] == "all"


def test_a_value_the_user_set_wins_and_is_reported(cache_root):
    settings = settings_from({}, cache_root=str(cache_root))
    environ = {"TRITON_CACHE_DIR": "/mine/triton"}
    exports = env.resolve(settings, environ)
    assert "TRITON_CACHE_DIR" not in exports.values
    assert exports.kept["TRITON_CACHE_DIR"][0] == "/mine/triton"
    assert any("keeping your TRITON_CACHE_DIR" in line for line in exports.messages())
    env.apply(exports, environ)
    assert environ["TRITON_CACHE_DIR"] == "/mine/triton"


def test_values_gpu_cache_set_itself_can_be_replaced(tmp_path):
    environ: dict[str, str] = {}
    env.apply(env.resolve(settings_from({}, cache_root=str(tmp_path / "a")), environ), environ)
    exports = env.resolve(settings_from({}, cache_root=str(tmp_path / "b")), environ)
    assert not exports.kept
    env.apply(exports, environ)
    assert environ["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "b" / "jax")


def test_user_pythonpath_is_kept_behind_the_hook(cache_root):
    exports = env.resolve(settings_from({}, cache_root=str(cache_root)), {"PYTHONPATH": "/mine"})
    assert exports.values["PYTHONPATH"].split(":") == [str(env.HOOK_DIR), "/mine"]


def test_caching_off_switches_jax_off_for_real():
    exports = env.resolve(settings_from({}, cache_root="none"), {})
    assert exports.values["JAX_ENABLE_COMPILATION_CACHE"] == "false"
    assert "JAX_COMPILATION_CACHE_DIR" not in exports.values
    assert "PYTHONPATH" not in exports.values


def test_a_root_that_cannot_be_created_degrades_with_reasons(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    exports = env.resolve(settings_from({}, cache_root=str(blocker / "cache")), {})
    assert exports.values["JAX_ENABLE_COMPILATION_CACHE"] == "false"
    assert "cannot create" in exports.problems["jax"]
    # Triton cannot be switched off: it goes to a node-local folder instead, and says so.
    assert exports.values["TRITON_CACHE_DIR"] == str(fs.node_local_fallback("triton"))
    assert "node-local" in exports.problems["triton"]


def test_shell_lines_work_with_eval(cache_root):
    result = run_cli("env", "--cache-root", str(cache_root))
    assert result.returncode == 0, result.stderr
    echo = 'echo "$JAX_COMPILATION_CACHE_DIR|$GPU_CACHE_MANAGED"'
    shown = subprocess.run(["bash", "-c", result.stdout + echo],
                           capture_output=True, text=True, env=clean_environ()).stdout.strip()
    folder, managed = shown.split("|")
    assert folder == str(cache_root / "jax")
    assert "TRITON_CACHE_DIR" in managed.split(",")


def test_env_json_reports_kept_values(cache_root):
    result = run_cli("env", "--json", "--cache-root", str(cache_root),
                     env=clean_environ(JAX_COMPILATION_CACHE_DIR="/mine/jax"))
    data = json.loads(result.stdout)
    assert data["kept"]["JAX_COMPILATION_CACHE_DIR"]["yours"] == "/mine/jax"
    assert "JAX_COMPILATION_CACHE_DIR" not in data["exports"]


# ---------------------------------------------------------------- paths that split (#21)

#: A job run from its working folder that imports a module kept there (through the empty
#: PYTHONPATH entry: the script itself lives elsewhere) and says which sitecustomize loaded.
JOB = ("import mymod, sys\n"
       "site = sys.modules.get('sitecustomize')\n"
       "print(mymod.VALUE, getattr(site, '__file__', None), sep='|')\n")


def job_in_working_folder(tmp_path: Path) -> tuple[Path, Path]:
    work = tmp_path / "work"
    work.mkdir()
    (work / "mymod.py").write_text("VALUE = 'from the working folder'\n")
    script = tmp_path / "elsewhere" / "job.py"
    script.parent.mkdir()
    script.write_text(JOB)
    return work, script


@pytest.mark.parametrize("pythonpath", ["/opt/lib:", ":/opt/lib", "/opt/lib::/opt/other"])
def test_an_empty_pythonpath_entry_still_means_the_working_folder_after_env(pythonpath, cache_root, tmp_path):
    """`export PYTHONPATH=/opt/lib:$PYTHONPATH` with PYTHONPATH unset leaves an empty entry,
    the working folder to Python: after `eval "$(gpu-cache env)"` the job still imports from
    it, and the hook loads too."""
    work, script = job_in_working_folder(tmp_path)
    environ = clean_environ(PYTHONPATH=pythonpath)
    plain = subprocess.run([sys.executable, str(script)], cwd=work, env=environ,
                           capture_output=True, text=True)
    assert plain.returncode == 0, plain.stderr  # the job works without gpu-cache
    python, scripts = shlex.quote(sys.executable), shlex.quote(str(SCRIPTS))
    # gpu-cache itself run as the rules run it (common.smk's form)
    shell = (f'eval "$(PYTHONPATH={scripts}${{PYTHONPATH:+:$PYTHONPATH}} {python} -m gpu_cache env '
             f'--cache-root {shlex.quote(str(cache_root))})" && '
             f'printf "%s\\n" "$PYTHONPATH" && {python} {shlex.quote(str(script))}')
    result = subprocess.run(["bash", "-c", shell], cwd=work, env=environ, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    exported, output = result.stdout.splitlines()
    assert exported == f"{env.HOOK_DIR}:{SCRIPTS}:{pythonpath}"  # the user's value as written
    assert output.split("|") == ["from the working folder", str(env.HOOK_DIR / "sitecustomize.py")]


def test_the_runner_keeps_an_empty_pythonpath_entry_for_builtin_workloads(tmp_path, monkeypatch):
    work, script = job_in_working_folder(tmp_path)
    monkeypatch.chdir(work)
    template = "{python} " + shlex.quote(str(script)) + " && {python} -c 'import gpu_cache'"
    command = Command("mine", 1, template, 60.0, builtin=True)
    line = shell_command(command, sys.executable, "cpu")
    log = tmp_path / "log.txt"
    with log.open("w") as output:
        result = run_command(command, line, clean_environ(PYTHONPATH="/opt/lib:"), output)
    assert result.returncode == 0, log.read_text()
    assert "from the working folder" in log.read_text()


def checkout_under_a_colon(tmp_path: Path) -> Path:
    """A copy of this checkout (the package, the workflow, its config) under a folder whose
    name holds ':'."""
    copy = tmp_path / "team:gpu-cache"
    for part in ("scripts", "workflow", "config"):
        shutil.copytree(REPO / part, copy / part, ignore=shutil.ignore_patterns("__pycache__", ".snakemake"))
    return copy


JAX_JOB = ("import mymod, jax, jax.numpy as jnp\n"
           "print(mymod.VALUE, float(jax.jit(lambda x: x * 3.0)(jnp.float32(2.0))), sep='|')\n")


@pytest.mark.slow
def test_gpu_cache_under_a_folder_with_a_colon_runs_jobs_without_its_hook(tmp_path, cache_root):
    """The hook's path would split on PYTHONPATH and silently never load: env says so in one
    line (exit 0), puts nothing of it on PYTHONPATH, and the job runs cached without it."""
    copy = checkout_under_a_colon(tmp_path)
    work, _ = job_in_working_folder(tmp_path)
    job = tmp_path / "elsewhere" / "jax_job.py"
    job.write_text(JAX_JOB)
    environ = {k: v for k, v in clean_environ().items() if k != "PYTHONPATH"}
    environ["PYTHONPATH"] = "/opt/lib:"
    # `python -m` from the copy's scripts/ runs the copy (sys.path[0] is the working folder).
    gpu_cache = f"cd {shlex.quote(str(copy / 'scripts'))} && {shlex.quote(sys.executable)} -m gpu_cache"
    root = shlex.quote(str(cache_root))
    shown = subprocess.run(["bash", "-c", f"{gpu_cache} env --json --cache-root {root}"],
                           env=environ, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    (line,) = json.loads(shown.stdout)["warnings"]
    assert "':'" in line and "without its startup hook" in line
    exports = json.loads(shown.stdout)["exports"]
    assert "PYTHONPATH" not in exports and "TRITON_CACHE_MANAGER" not in exports
    assert exports["JAX_COMPILATION_CACHE_DIR"] == str(cache_root / "jax")
    assert all(str(copy) not in exports.get(name, "") for name in names.CONTAINER_BIND_VARS)
    shell = (f'eval "$({gpu_cache} env --cache-root {root})" && '
             f'cd {shlex.quote(str(work))} && {shlex.quote(sys.executable)} {shlex.quote(str(job))}')
    result = subprocess.run(["bash", "-c", shell], env=environ, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    ours = [row for row in result.stderr.splitlines() if row.startswith("gpu-cache:")]
    assert ours == [f"gpu-cache: warning: {line}"]
    assert result.stdout.splitlines()[-1] == "from the working folder|6.0"
    assert any(path.name.endswith("-cache") for path in (cache_root / "jax").iterdir())
    assert not (cache_root / "records").exists() or not any((cache_root / "records").iterdir())


@pytest.mark.slow
def test_a_workflow_under_a_folder_with_a_colon_refuses_at_once_in_one_line(tmp_path):
    """Its rules put the package's folder on PYTHONPATH, which cannot hold it: Snakemake stops
    before any job with one line that says so (not a rule failing to import gpu_cache later).
    The package is installed there as `pip install -e` of that checkout installs it (a .pth line)."""
    copy = checkout_under_a_colon(tmp_path)
    python = fresh_venv(tmp_path / "venv", copy / "scripts")
    work = tmp_path / "work"
    work.mkdir()
    environ = {k: v for k, v in clean_environ().items() if k != "PYTHONPATH"}
    command = [str(python), "-m", "snakemake", "-s", str(copy / "workflow" / "Snakefile"), "--cores", "1"]
    result = subprocess.run(command, cwd=work, env=environ, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        f"gpu-cache: it is installed under {copy / 'scripts'}, whose path holds ':', which PYTHONPATH "
        "cannot hold, so its rules could not import it; install it under a path without ':'"]
    assert not (work / "results").exists()


CONTAINER_JOB = ("import os, jax, jax.numpy as jnp\n"
                 "print(float(jax.jit(lambda x: x * 3.0)(jnp.float32(2.0))), "
                 "os.path.isdir(os.environ['JAX_COMPILATION_CACHE_DIR']))\n")


def test_a_root_the_host_binds_elsewhere_is_bound_at_its_own_path_too(container_root, unbound_dir):
    """`APPTAINER_BIND=<root>:/cache` shows the root at /cache only, while the exported
    variables name <root>: env adds the bind at its own path, and a JAX job in the container
    writes its entries into the root. With `:ro` the added bind is read-only too."""
    root = unbound_dir / "cache"
    bound = f"{root}:/cache"
    shown = run_cli("env", "--json", "--cache-root", str(root), env=clean_environ(APPTAINER_BIND=bound))
    assert shown.returncode == 0, shown.stderr
    exports = json.loads(shown.stdout)["exports"]
    assert exports["APPTAINER_BIND"].split(",")[:2] == [bound, str(root)]
    assert exports["SINGULARITY_BIND"].split(",")[0] == str(root)
    environ = container_root.environ(clean_environ(**exports))
    ran = container_root.exec("python3", "-c", CONTAINER_JOB, env=environ)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.split() == ["6.0", "True"]
    assert any(path.name.startswith("jit_") for path in (root / "jax").iterdir())  # jax 0.4.30 names
    assert any((root / "records").iterdir())  # the hook ran too

    read_only = f"{root}:/cache:ro"
    shown = run_cli("env", "--json", "--cache-root", str(root), env=clean_environ(APPTAINER_BIND=read_only))
    exports = json.loads(shown.stdout)["exports"]
    assert exports["APPTAINER_BIND"].split(",")[:2] == [read_only, f"{root}:{root}:ro"]
    look = container_root.exec("sh", "-c", 'test -d "$1/jax" && ! touch "$1/jax/new"', "sh", str(root),
                               env=container_root.environ(clean_environ(**exports)))
    assert look.returncode == 0, look.stderr
    # A bind at its own path (with or without options) is kept as it is.
    for done in (str(root), f"{root}:{root}", f"{root}/:{root}:rw"):
        shown = run_cli("env", "--json", "--cache-root", str(root), env=clean_environ(APPTAINER_BIND=done))
        assert json.loads(shown.stdout)["exports"]["APPTAINER_BIND"].split(",")[0] == done
        assert str(root) not in json.loads(shown.stdout)["exports"]["APPTAINER_BIND"].split(",")[1:]
