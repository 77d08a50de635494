"""The CLI as another user, for the trust tests (tests/test_trust*.py): a config everyone may
read, ``python -m gpu_cache`` run with runuser (the interpreter and checkout bound where that user
can reach them), and what a result must not show."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from helpers import REPO, clean_environ, write_config

#: A config that runs no workload: the commands check the cache folders and return quickly.
NO_WORK = {"default_workloads": []}


def one_config(folder: Path, config: dict) -> Path:
    path = write_config(folder / "config.yaml", config)
    path.chmod(0o644)
    return path


def as_user(user: str, base: Path, *args: str, env: dict[str, str] | None = None,
            module: tuple[str, ...] = ("-m", "gpu_cache")) -> subprocess.CompletedProcess[str]:
    """``python -m gpu_cache ARGS`` as ``user`` (with runuser). This interpreter and checkout
    may live where the user cannot reach (here /root/.pyenv; CI's checkout and its venv): then
    they are bind-mounted into ``base`` in a private mount namespace for the one command."""
    environ = {k: v for k, v in (env or clean_environ()).items() if k != "PYTHONPATH"}
    tmp = base / f"tmp-{user}"
    tmp.mkdir(exist_ok=True)
    shutil.chown(tmp, user=user)
    environ["TMPDIR"] = str(tmp)  # node-local fallbacks land here, removed with base
    python, scripts = sys.executable, REPO / "scripts"
    reachable = subprocess.run(["runuser", "-u", user, "--", "test", "-x", python, "-a", "-r",
                                str(scripts / "gpu_cache" / "config.schema.yaml")]).returncode == 0
    binds: list[str] = []
    path = [str(scripts)]
    if not reachable:
        # The base interpreter, the checkout and (in a venv) the venv, each bound into base: a
        # venv's own python would look for its home where the user cannot reach it again.
        binds = [sys.base_prefix, str(base / "py"), str(REPO), str(base / "repo")]
        real = Path(os.path.realpath(sys.executable)).relative_to(os.path.realpath(sys.base_prefix))
        python = str(base / "py" / real)
        path = [str(base / "repo" / "scripts")]
        if sys.prefix != sys.base_prefix:
            binds += [sys.prefix, str(base / "env")]
            path.append(str(base / "env" / Path(sysconfig.get_paths()["purelib"]).relative_to(sys.prefix)))
        for target in binds[1::2]:
            Path(target).mkdir(exist_ok=True)
        environ["LD_LIBRARY_PATH"] = str(base / "py" / "lib")  # its libpython, not the system's
    environ["PYTHONPATH"] = os.pathsep.join(path)
    command = ["runuser", "-u", user, "--", "env", *(f"{k}={v}" for k, v in environ.items()),
               python, *module, *args]
    if binds:
        command = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                   'while [ "$1" != -- ]; do mount --bind "$1" "$2" || exit 1; shift 2; done; '
                   'shift; exec "$@"',
                   "sh", *binds, "--", *command]
    return subprocess.run(command, capture_output=True, text=True, cwd=base, timeout=300)


def no_traceback(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout, result.stderr


def warning_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("gpu-cache: warning:")]
