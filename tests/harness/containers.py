"""Container tests: the isolated filesystem roots and the ``apptainer`` stand-in that runs jobs in them.

``.ci/build-roots.sh`` builds each root (a minimal Debian tree with its own Python and jax, e.g.
Python 3.9 + jax 0.4.30 against the host's 3.11 + 0.10.2) under :func:`roots_dir`, with a manifest
``<name>.json`` next to it. ``tests/bin/apptainer`` is an Apptainer-compatible launcher over bwrap
(read its docstring for what it does and does not prove): put :data:`BIN` first on ``PATH`` and
``snakemake --sdm apptainer`` runs a rule with ``container: "docker://gpu-cache-test/<name>"`` in
that root. Nothing here downloads; a missing root means ``.ci/build-roots.sh`` has not run.

Usage in a test (the ``container_root`` fixture of conftest.py returns a :class:`ContainerRoot`)::

    def test_x(container_root, tmp_path):
        env = container_root.environ(JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax"))
        run_snakemake(workdir, "--sdm", "apptainer", "--cores", "1", env=env)
        container_root.exec("python3", "-c", "import jax", env=env, binds=[some_dir])
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
#: The folder with the ``apptainer`` stand-in; first on ``PATH`` for container jobs.
BIN = TESTS / "bin"
APPTAINER = BIN / "apptainer"
DEFAULT_ROOTS = Path("/var/cache/gpu-cache-test-roots")
IMAGE_PREFIX = "docker://gpu-cache-test/"
#: The root every container test can rely on (built by .ci/build-roots.sh).
DEFAULT_ROOT = "bullseye-py39-jax0430"
#: Host paths bound into every container by default (besides the home and current directories).
DEFAULT_BOUND = ("/tmp", "/var/tmp", "/dev", "/proc", "/sys")


def roots_dir() -> Path:
    """Where the roots are: ``$GPU_CACHE_TEST_ROOTS`` or /var/cache/gpu-cache-test-roots."""
    return Path(os.environ.get("GPU_CACHE_TEST_ROOTS") or DEFAULT_ROOTS)


def image_url(name: str) -> str:
    """The ``container:`` value that the stand-in maps to root ``name``."""
    return IMAGE_PREFIX + name


def with_bin_first(env: dict[str, str]) -> dict[str, str]:
    """A copy of ``env`` whose ``PATH`` starts with tests/bin (the stand-in ``apptainer``)."""
    env = dict(env)
    parts = [p for p in env.get("PATH", os.defpath).split(os.pathsep) if p and Path(p) != BIN]
    env["PATH"] = os.pathsep.join([str(BIN), *parts])
    env["GPU_CACHE_TEST_ROOTS"] = str(roots_dir())
    return env


@dataclass(frozen=True)
class ContainerRoot:
    """One built root: where it is, what is in it (the manifest), and how to run things in it."""

    name: str
    path: Path
    manifest: dict = field(repr=False)

    @property
    def image(self) -> str:
        return image_url(self.name)

    @property
    def python_version(self) -> str:
        return self.manifest["python"]

    @property
    def jax_version(self) -> str:
        return self.manifest["jax"]

    def environ(self, base: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
        """Environment for processes that start container jobs: ``base`` (default: the tests'
        clean environment) plus ``extra``, with tests/bin first on ``PATH``."""
        if base is None:
            from helpers import clean_environ  # the tests' clean environment
            base = clean_environ()
        return with_bin_first({**base, **extra})

    def exec(self, *command: str, env: dict[str, str] | None = None, binds: tuple | list = (),
             options: tuple | list = (), cwd: Path | str | None = None,
             timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``apptainer exec [--bind B ...] [options] <image> command...`` through the stand-in.

        ``binds`` are ``src[:dst[:ro]]`` strings or paths; ``env`` defaults to :meth:`environ`.
        """
        args = [str(APPTAINER), "exec"]
        for bind in binds:
            args += ["--bind", str(bind)]
        args += [*map(str, options), self.image, *command]
        return subprocess.run(args, env=with_bin_first(env) if env is not None else self.environ(),
                              cwd=cwd, capture_output=True, text=True, timeout=timeout)


def find_root(name: str = DEFAULT_ROOT) -> tuple[ContainerRoot | None, str | None]:
    """(the root, None) when ``name`` is built and the stand-in can run it, else (None, why not)."""
    if shutil.which("bwrap") is None:
        return None, "bwrap is not installed (run .ci/build-roots.sh)"
    path = roots_dir() / name
    manifest_path = roots_dir() / f"{name}.json"
    if not path.is_dir() or not manifest_path.is_file():
        return None, f"container root {path} is not built (run .ci/build-roots.sh)"
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as error:
        return None, f"unreadable manifest {manifest_path}: {error}"
    root = ContainerRoot(name, path, manifest)
    probe = subprocess.run([str(APPTAINER), "exec", root.image, "true"],
                           env=with_bin_first({k: v for k, v in os.environ.items()
                                               if not k.startswith(("APPTAINER", "SINGULARITY"))}),
                           cwd=tempfile.gettempdir(),
                           capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        return None, f"the apptainer stand-in cannot run {root.image}: {probe.stderr.strip()}"
    return root, None


def unbound_host_dir(prefix: str = ".gpu-cache-unbound-") -> Path:
    """A new, empty host folder that no default bind of a container shows (not under /tmp,
    /var/tmp, $HOME or the usual working directories): a container sees it only when it is
    bound explicitly. The caller removes it (``shutil.rmtree``)."""
    home = Path(os.path.expanduser("~")).resolve()
    for candidate in (roots_dir(), Path("/var/cache"), Path("/srv"), Path("/opt")):
        resolved = candidate.resolve()
        if any(resolved == Path(top) or Path(top) in resolved.parents for top in ("/tmp", "/var/tmp")):
            continue
        if resolved == home or home in resolved.parents:
            continue
        try:
            return Path(tempfile.mkdtemp(prefix=prefix, dir=resolved))
        except OSError:
            continue
    raise RuntimeError("no writable host folder outside the default container binds")
