"""The AlphaPulldownSnakemake look-alike (tests/aps_host) deployed as its users deploy it, for the
module tests (tests/test_aps_host*.py): the folder snakedeploy makes with the README's block at
the end of its Snakefile, the look-alike's desktop profile, the container stand-in's
environment, what its jobs recorded and predicted, and the jobs a dry run plans."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from helpers import REPO, SNAKEFILE, read_json
from release import TAG, released_repo, tagged_repo

FIXTURE = REPO / "tests" / "aps_host"
#: The host's config changed for a machine without a GPU (config/test.yaml); then gpu-cache's
#: settings as the README has them, and what the tests change in those.
HOST_ONLY = ("--configfile", "config/test.yaml")
WITH_GPU_CACHE = ("--configfile", "config/test.yaml", "config/gpu-cache.yaml", "config/test-gpu-cache.yaml")
#: Where AlphaPulldown's AlphaFold 3 images keep AlphaFold 3 (docker/alphafold3.dockerfile,
#: 2.1.8 to 2.6.2): the tests bind the stand-in run_alphafold.py (tests/fixtures) there, so
#: the image has it where the real ones do.
IMAGE_AF3 = "/app/AlphaPulldown/alphafold3"
#: Where the tests put the pipeline's own stand-ins in the image (on its PATH).
IMAGE_BIN = "/app/AlphaPulldown/bin"


#: The pipeline's release its users deploy (AlphaPulldownSnakemake's README).
APS_TAG = "2.6.2"
#: How the README's block names gpu-cache's workflow (a module by tag).
README_MODULE = f'github("OWNER/gpu-cache", path="workflow/Snakefile", tag="{TAG}")'


def aps_copy(tmp_path: Path, by_tag: bool = False) -> Path:
    """The folder `snakedeploy deploy-workflow <pipeline> DEST --tag 2.6.2` makes (written by
    snakedeploy: config/ copied, workflow/Snakefile with the pipeline as a module), the project's
    data beside it, and the README's block at the end of its Snakefile. ``by_tag``: both modules
    by tag from git repositories; else by path (the fixture's Snakefile, the checkout's)."""
    work = tmp_path / "aps"
    deploy = subprocess.run([sys.executable, "-m", "snakedeploy.client", "deploy-workflow", str(FIXTURE),
                             str(work), "--tag", APS_TAG, "--name", "AlphaPulldownSnakemake"],
                            capture_output=True, text=True, timeout=300)
    assert deploy.returncode == 0, deploy.stderr[-2000:]
    for data in ("data", "weights"):
        shutil.copytree(FIXTURE / data, work / data)
    if by_tag:
        aps = tagged_repo(FIXTURE, tmp_path / "AlphaPulldownSnakemake.git", APS_TAG)
        pipeline = f'gitfile("{aps}", path="workflow/Snakefile", tag="{APS_TAG}")'
        ours = f'gitfile("{released_repo(tmp_path)}", path="workflow/Snakefile", tag="{TAG}")'
    else:
        pipeline, ours = f'"{FIXTURE / "workflow" / "Snakefile"}"', f'"{SNAKEFILE}"'
    snakefile = work / "workflow" / "Snakefile"
    generated = snakefile.read_text()
    assert '"workflow/Snakefile"' in generated  # snakedeploy's path for a local source
    (block,) = readme_blocks("python")
    snakefile.write_text(generated.replace('"workflow/Snakefile"', pipeline) + "\n\n"
                         + block.replace(README_MODULE, ours))
    return work


def profile(work: Path, *settings: str) -> tuple[str, ...]:
    """The look-alike's desktop profile, 2 cores, its images pulled into the copy, ``settings``
    (default: with gpu-cache)."""
    images = str(work / "images")
    return ("--profile", "config/profiles/desktop", "--cores", "2", "--apptainer-prefix", images,
            *(settings or WITH_GPU_CACHE))


def write_yaml(path: Path, document: dict) -> None:
    path.write_text(yaml.safe_dump(document))


def aps_environ(container_root, **extra: str) -> dict[str, str]:
    """The environment of a run of the look-alike: the container stand-in first on PATH, and
    AlphaFold 3's stand-in in the image where AlphaPulldown's images keep it, the pipeline's
    own stand-ins on the image's PATH (run_structure_prediction.py, alphajudge)."""
    binds = f"{REPO / 'tests' / 'fixtures'}:{IMAGE_AF3}:ro,{FIXTURE / 'workflow' / 'scripts'}:{IMAGE_BIN}:ro"
    return container_root.environ(APPTAINER_BIND=binds, APPTAINERENV_PREPEND_PATH=IMAGE_BIN, **extra)


def records(root: Path, rule: str | None = None) -> list[dict]:
    found = [json.loads(p.read_text()) for p in sorted((root / "records").glob("*.json"))]
    return [r for r in found if rule is None or r.get("rule") == rule]


def predictions(work: Path) -> dict[str, dict]:
    found = (work / "output" / "predictions").glob("*/ranking_debug.json")
    return {p.parent.name: read_json(p) for p in found}


def job_counts(dry: subprocess.CompletedProcess[str]) -> dict[str, str]:
    return dict(re.findall(r"^(\S+)\s+(\d+)$", dry.stdout, re.MULTILINE))


def planned_jobs(text: str) -> dict[str, list[list[str]]]:
    """The jobs a dry run with printshellcmds lists, by rule: each its lines (what it reads and
    writes, wildcards, threads, resources, its shell command), without its job id and reason."""
    jobs: dict[str, list[list[str]]] = {}
    lines: list[str] | None = None
    for line in text.splitlines():
        start = re.match(r"^(?:local)?(?:rule|checkpoint) (\S+):$", line)
        if start:
            lines = []
            jobs.setdefault(start.group(1), []).append(lines)
        elif line.startswith(("[", "Job stats")):
            lines = None
        elif lines is not None and line.strip() and not line.strip().startswith(("jobid:", "reason:")):
            lines.append(line.strip())
    return jobs

def readme_section() -> str:
    text = (REPO / "README.md").read_text()
    return text.split("## Use it inside a pipeline, as a Snakemake module", 1)[1].split("\n## ", 1)[0]


def readme_blocks(language: str) -> list[str]:
    """The code blocks of README.md's module section in ``language``."""
    return re.findall(rf"```{language}\n(.*?)```", readme_section(), re.DOTALL)
