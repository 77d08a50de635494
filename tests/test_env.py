"""The exported cache environment: values, user-set values winning, unusable roots."""

import subprocess

from gpu_cache.config.settings import settings_from
from gpu_cache.jobenv import env
from helpers import clean_environ, run_cli


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
    assert exports.values["TRITON_CACHE_DIR"] == str(env.node_local_fallback("triton"))
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
    import json

    data = json.loads(result.stdout)
    assert data["kept"]["JAX_COMPILATION_CACHE_DIR"]["yours"] == "/mine/jax"
    assert "JAX_COMPILATION_CACHE_DIR" not in data["exports"]
