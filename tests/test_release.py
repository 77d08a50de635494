"""gpu-cache as its users install it (docs/module.md, README): one version; an sdist and a wheel
that carry the workflow; the main job from the wheel alone in an empty folder; a module by tag,
served from git objects, that imports the installed package, and says in one line what to
install when that package is missing or of another version.

The wheel is built from this checkout and installed into fresh venvs (harness/release.py); the
module by tag is a git repository of this checkout's files with the tag, as Snakemake's
``gitfile(...)`` serves it (the same mechanism as ``github(...)``, offline).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml

from gpu_cache import __version__
from helpers import REPO, SMALL, clean_environ, read_json, run_cli, run_snakemake
from release import TAG, VERSION, build, fresh_venv, install, released_repo

pytestmark = pytest.mark.slow  # builds, venvs and Snakemake runs


def without_pythonpath(**extra: str) -> dict[str, str]:
    """A clean environment without the checkout's package on PYTHONPATH."""
    return {k: v for k, v in clean_environ(**extra).items() if k != "PYTHONPATH"}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """The sdist and the wheel of this checkout, built once for this module."""
    return build(tmp_path_factory.mktemp("dist"))


def test_one_version_is_the_packages_the_clis_and_the_changelogs(tmp_path):
    assert __version__ == VERSION
    assert run_cli("--version").stdout.strip() == f"gpu-cache {VERSION}"
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert re.search(r"^## (\S+)", changelog, re.MULTILINE).group(1) == VERSION  # the latest entry
    readme = (REPO / "README.md").read_text()
    assert f'tag="{TAG}"' in readme and f"gpu-cache@{TAG}" in readme  # the tag the README deploys
    assert f"pip install ./gpu_cache-{VERSION}-py3-none-any.whl" in readme  # the wheel it installs


def test_the_wheel_carries_the_workflow_the_profiles_and_the_hook_and_twine_passes_both(built):
    sdist, wheel = built
    assert wheel.name == f"gpu_cache-{VERSION}-py3-none-any.whl"
    check = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)],
                           capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr
    with zipfile.ZipFile(wheel) as archive:
        members = {info.filename: info for info in archive.infolist()}
    package = "gpu-cache/gpu_cache/"
    # The package in a folder of its own, found through the .pth; nothing else at the top.
    assert {name.split("/")[0] for name in members} == {"gpu-cache", "gpu-cache.pth",
                                                        f"gpu_cache-{VERSION}.dist-info"}
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read("gpu-cache.pth").decode().strip() == "gpu-cache"
    # Every file of the workflow, the profiles and the hook, and the embedded default config.
    wanted = {f"{package}{top}/{p.relative_to(REPO / top)}" for top in ("workflow", "profiles")
              for p in (REPO / top).rglob("*") if p.is_file()}
    hook = REPO / "scripts" / "gpu_cache" / "_hook"
    wanted |= {f"{package}_hook/{p.relative_to(hook)}" for p in hook.rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    wanted.add(f"{package}config/config.yaml")
    assert sorted(wanted - set(members)) == []
    assert members[f"{package}workflow/VERSION"].file_size == len(f"{VERSION}\n")
    shim = members[f"{package}_hook/gpu_cache_hook/kinds/ptxas/bin/ptxas"]
    assert shim.external_attr >> 16 & 0o111 == 0o111  # executable, as pip installs it


class WheelRun(NamedTuple):
    """A fresh venv holding the wheel alone, the main job run in an empty folder with it."""

    python: Path
    env: dict[str, str]
    work: Path
    result: subprocess.CompletedProcess[str]

    def run(self, *command: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(command), cwd=cwd or self.work, env=self.env, capture_output=True,
                              text=True, timeout=900)


@pytest.fixture(scope="module")
def wheel_run(built, tmp_path_factory) -> WheelRun:
    """The README's commands for a release, in a fresh venv that holds the wheel and no
    checkout, in an empty folder: install-profile, deploy, snakemake --profile gpu-cache."""
    folder = tmp_path_factory.mktemp("wheel")
    python = fresh_venv(folder / "venv")
    install(python, built[1])
    env = without_pythonpath(GPU_CACHE_ROOT=str(folder / "cache"))
    env["PATH"] = f"{python.parent}{os.pathsep}{env['PATH']}"
    env["XDG_CONFIG_HOME"] = str(folder / "config-home")  # install-profile's default place
    empty = folder / "empty"
    empty.mkdir()
    run = WheelRun(python, env, empty / "gpu-cache-run", subprocess.CompletedProcess([], 1))
    assert run.run("gpu-cache", "install-profile", cwd=empty).returncode == 0
    deployed = run.run("gpu-cache", "deploy", "gpu-cache-run", cwd=empty)
    assert deployed.returncode == 0, deployed.stderr
    # The tests' small workload (the embedded default, smaller), as a user edits config.yaml.
    config_file = run.work / "config" / "config.yaml"
    config_file.write_text(yaml.safe_dump(yaml.safe_load(config_file.read_text()) | SMALL))
    result = run.run(str(python), "-m", "snakemake", "--profile", "gpu-cache", "--cores", "2")
    return run._replace(result=result)


def test_the_main_job_runs_from_the_wheel_alone_in_an_empty_folder(wheel_run):
    """PASSED, with the version recorded; the folder deploy wrote names no path to outlive."""
    assert wheel_run.run("gpu-cache", "--version").stdout.strip() == f"gpu-cache {VERSION}"
    site = Path(wheel_run.run(str(wheel_run.python), "-c", "import gpu_cache; print(gpu_cache.__file__)")
                .stdout.strip())
    assert site.parts[-4:] == ("site-packages", "gpu-cache", "gpu_cache", "__init__.py"), site
    work = wheel_run.work
    assert sorted(str(p.relative_to(work)) for p in (work / "workflow").rglob("*") if p.is_file()) == [
        "workflow/Snakefile"]
    assert str(site.parent) not in (work / "workflow" / "Snakefile").read_text()
    result = wheel_run.result
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"gpu-cache {VERSION} summary" in result.stderr and "cpu on cpu: PASSED" in result.stderr
    verdict = read_json(work / "results" / "gpu-cache" / "validate" / "cpu.json")
    assert verdict["passed"] and verdict["gpu_cache_version"] == VERSION
    # The jobs' path and their images' binds hold the package's own folder, never site-packages.
    exports = json.loads(wheel_run.run("gpu-cache", "env", "--json").stdout)["exports"]
    assert exports["PYTHONPATH"].split(os.pathsep)[0] == str(site.parent / "_hook")
    binds = exports["APPTAINER_BIND"].split(",")
    assert str(site.parent.parent) in binds and str(site.parent.parent.parent) not in binds


def test_carry_from_the_wheel_packs_and_runs_the_image_to_check_its_software(wheel_run, container_root):
    """pack and unpack from the installed package: unpack runs the image (its Python, with the
    installed package's software probe) and refuses the host's entries for the image's jax."""
    assert wheel_run.result.returncode == 0, wheel_run.result.stderr[-3000:]
    archive = wheel_run.work / "cpu.tar.gz"
    packed = wheel_run.run("gpu-cache", "pack", str(archive), "--gpu-type", "cpu")
    assert packed.returncode == 0, packed.stderr
    env = container_root.environ(wheel_run.env)
    command = ["gpu-cache", "unpack", str(archive), "--cache-root", str(wheel_run.work / "other"),
               "--image", container_root.image]
    unpacked = subprocess.run(command, cwd=wheel_run.work, env=env, capture_output=True, text=True,
                              timeout=300)
    assert unpacked.returncode == 1, unpacked.stderr
    assert f"jax {container_root.jax_version}" in unpacked.stderr, unpacked.stderr
    assert not (wheel_run.work / "other").exists()


def host_snakefile(snakefile: str) -> str:
    """A host whose only content is gpu-cache as a module (its own config), ``snakefile`` its
    snakefile: declaration."""
    return ("configfile: \"config/config.yaml\"\n\n\n"
            f"module gpu_cache:\n    snakefile:\n        {snakefile}\n    config:\n        config\n\n\n"
            "use rule * from gpu_cache as gpu_cache_*\n")


def by_tag(tmp_path: Path) -> tuple[Path, str]:
    """A host folder with gpu-cache as a module by tag (a git repository of this checkout)."""
    repo = released_repo(tmp_path)
    host = tmp_path / "host"
    (host / "config").mkdir(parents=True)
    (host / "config" / "config.yaml").write_text(yaml.safe_dump(SMALL))
    declaration = f'gitfile("{repo}", path="workflow/Snakefile", tag="{TAG}")'
    (host / "Snakefile").write_text(host_snakefile(declaration))
    return host, str(repo)


def test_a_module_by_tag_runs_from_git_with_the_installed_package(tmp_path):
    """No file of the workflow lies on disk (a clone without a working tree): the module finds
    its code in the package Snakemake's Python imports, and its jobs run it."""
    host, repo = by_tag(tmp_path)
    assert [p.name for p in Path(repo).iterdir()] == [".git"]
    env = clean_environ(GPU_CACHE_ROOT=str(tmp_path / "cache"))
    result = run_snakemake(host, "--cores", "2", "gpu_cache_warm", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    verdict = read_json(host / "results" / "gpu-cache" / "validate" / "cpu.json")
    assert verdict["passed"], verdict["problems"]
    assert verdict["gpu_cache_version"] == VERSION


def test_a_module_from_the_installed_package_plans_gpu_caches_jobs(tmp_path):
    """The README's module without git: the installed package's own workflow."""
    host = tmp_path / "host"
    (host / "config").mkdir(parents=True)
    (host / "config" / "config.yaml").write_text(yaml.safe_dump(SMALL))
    (host / "Snakefile").write_text("import gpu_cache\n\n\n" + host_snakefile("gpu_cache.snakefile()"))
    result = run_snakemake(host, "--cores", "1", "-n", "gpu_cache_all",
                           env=clean_environ(GPU_CACHE_ROOT=str(tmp_path / "cache")))
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"^gpu_cache_validate_cache\s+1$", result.stdout, re.MULTILINE), result.stdout


def another_version(tmp_path: Path, version: str) -> Path:
    """gpu-cache's package as another release has it: its files, its workflow/VERSION
    ``version``; the folder that holds it."""
    folder = tmp_path / f"gpu-cache-{version}"
    shutil.copytree(REPO / "scripts" / "gpu_cache", folder / "gpu_cache", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", "workflow"))
    shutil.copytree(REPO / "workflow", folder / "gpu_cache" / "workflow")
    (folder / "gpu_cache" / "workflow" / "VERSION").write_text(f"{version}\n")
    return folder


@pytest.mark.parametrize("installed", [None, "0.1.9"])
def test_a_module_by_tag_without_its_package_stops_before_any_job_in_one_line(installed, tmp_path):
    host, repo = by_tag(tmp_path)
    paths = [another_version(tmp_path, installed)] if installed else []
    python = fresh_venv(tmp_path / "venv", *paths)
    env = without_pythonpath(GPU_CACHE_ROOT=str(tmp_path / "cache"))
    result = subprocess.run([str(python), "-m", "snakemake", "--cores", "1", "-n"], cwd=host, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    found = f"{installed} (in {paths[0] / 'gpu_cache'})" if installed else "none"
    assert result.stderr.strip().splitlines() == [
        f"gpu-cache: this workflow is gpu-cache {VERSION} and needs its package of that version in "
        f"Snakemake's Python ({python}), which has {found}: pip install \"git+file://{repo}@{TAG}\""]
    assert not (host / "results").exists() and not (tmp_path / "cache").exists()


def test_deploy_writes_the_same_again_and_refuses_an_edited_file(tmp_path):
    first = run_cli("deploy", str(tmp_path / "run"))
    assert first.returncode == 0, first.stderr
    snakefile = (tmp_path / "run" / "workflow" / "Snakefile").read_text()
    assert "include: gpu_cache.snakefile()" in snakefile and VERSION not in snakefile
    assert run_cli("deploy", str(tmp_path / "run")).returncode == 0  # the same files: kept
    config = tmp_path / "run" / "config" / "config.yaml"
    config.write_text(config.read_text() + "cache_root: /elsewhere\n")
    again = run_cli("deploy", str(tmp_path / "run"))
    assert again.returncode == 2 and again.stderr.count("\n") == 1
    assert "config.yaml exists and differs from what deploy writes (edited?)" in again.stderr
    assert "/elsewhere" in config.read_text()
    assert run_cli("deploy", "--force", str(tmp_path / "run")).returncode == 0
    assert "/elsewhere" not in config.read_text()


#: What a job in an image reports: its jax, the runner module it imports, whether Snakemake's
#: site-packages (the venv's jax) is there, and whether gpu-cache's startup hook loaded.
IN_IMAGE = ("import os, sys, jax, gpu_cache.core.runner as runner\n"
            "print(jax.__version__, runner.__file__, os.path.exists(sys.argv[1]),\n"
            "      'sitecustomize' in sys.modules)\n")


def test_a_job_in_an_image_runs_the_installed_package_with_the_images_own_jax(built, container_root,
                                                                             unbound_dir):
    """The wheel's package in a job's image, as the rules start the runner there: its folder on
    PYTHONPATH and bound at its own path (the venv lies where the image sees nothing unbound),
    never the venv's site-packages, whose jax would shadow the image's."""
    python = fresh_venv(unbound_dir / "venv")
    install(python, built[1])
    env = without_pythonpath(GPU_CACHE_ROOT=str(unbound_dir / "cache"))
    done = subprocess.run([str(python), "-m", "gpu_cache", "env", "--json"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    exports = json.loads(done.stdout)["exports"]
    package = Path(exports["APPTAINER_BIND"].split(",")[-1])
    assert package.name == "gpu-cache" and package.parent.name == "site-packages"
    job_env = container_root.environ(env, **exports)
    job_env["PYTHONPATH"] = f"{package}{os.pathsep}{exports['PYTHONPATH']}"  # gpu_cache_runner's prefix
    job = container_root.exec("python3", "-c", IN_IMAGE, str(package.parent / "jax"), env=job_env)
    assert job.returncode == 0, job.stderr[-2000:]
    jax_version, runner, site_packages_seen, hook = job.stdout.split()
    assert jax_version == container_root.jax_version != __import__("jax").__version__
    assert runner.startswith(f"{package}/gpu_cache/") and hook == "True"
    assert site_packages_seen == "False"
