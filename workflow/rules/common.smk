# Config validation, the cache environment, and the helpers the rules use.

import json
import os
import re
import shlex
import sys
from pathlib import Path

from snakemake.settings.types import DeploymentMethod
from snakemake.utils import min_version, validate

min_version("9.0")

# The package lives in the checkout's scripts/ folder: importable without installation.
GPU_CACHE_SCRIPTS = Path(workflow.current_basedir).parent.parent / "scripts"
if str(GPU_CACHE_SCRIPTS) not in sys.path:
    sys.path.insert(0, str(GPU_CACHE_SCRIPTS))

from gpu_cache import env as gpu_cache_env
from gpu_cache.errors import UsageError as GpuCacheUsageError
from gpu_cache.settings import settings_from as gpu_cache_settings_from
from gpu_cache.targets import gpu_types as gpu_cache_gpu_types
from gpu_cache.workload import plan_phase as gpu_cache_plan_phase

validate(config, str(Path(workflow.current_basedir).parent / "schemas" / "config.schema.yaml"))
try:
    GPU_CACHE_SETTINGS = gpu_cache_settings_from(config)
except GpuCacheUsageError as error:
    raise ValueError(f"gpu-cache config: {error}") from None

# Export at parse time: reaches every job of this workflow (and, as a module, of the host),
# local or remote, even without the gpu-cache profile. A value the user set wins.
gpu_cache_env.export(GPU_CACHE_SETTINGS)

GPU_CACHE_TYPES = gpu_cache_gpu_types(GPU_CACHE_SETTINGS)
GPU_CACHE_CONFIG_JSON = json.dumps(GPU_CACHE_SETTINGS.config, sort_keys=True)


wildcard_constraints:
    gpu_type="|".join(re.escape(name) for name in GPU_CACHE_TYPES),


def gpu_cache_cli(wildcards=None):
    """The gpu-cache command for the bookkeeping rules, runnable without installing the
    package: the conda environment's Python under --sdm conda (envs/gpu-cache.yaml), else
    Snakemake's own (which has what gpu-cache needs: it brings pyyaml and jsonschema)."""
    methods = workflow.deployment_settings.deployment_method
    python = "python" if DeploymentMethod.CONDA in methods else shlex.quote(sys.executable)
    scripts = shlex.quote(str(GPU_CACHE_SCRIPTS))
    return f"PYTHONPATH={scripts}${{PYTHONPATH:+:$PYTHONPATH}} {python} -m gpu_cache"


def gpu_cache_in_job_software(gpu_type):
    """Whether warm and validate of this type run in its jobs' container or conda
    environment: the type names one and Snakemake deploys that kind."""
    spec = GPU_CACHE_TYPES[gpu_type]
    methods = workflow.deployment_settings.deployment_method
    return bool(
        (spec.container and DeploymentMethod.APPTAINER in methods)
        or (spec.conda and DeploymentMethod.CONDA in methods)
    )


def gpu_cache_container(wildcards):
    """The container image of this GPU type's jobs (None: none)."""
    return GPU_CACHE_TYPES[wildcards.gpu_type].container


def gpu_cache_conda(wildcards):
    """The conda environment of this GPU type's jobs (None: none); an environment file given
    by a relative path is relative to the working directory, as the config's other paths."""
    environment = GPU_CACHE_TYPES[wildcards.gpu_type].conda
    if environment and environment.endswith((".yaml", ".yml")) and not os.path.isabs(environment):
        return os.path.abspath(environment)
    return environment


def gpu_cache_runner(wildcards):
    """The workload runner, with the Python of the type's jobs: the image's or conda
    environment's own when warm and validate run there, else the type's `python`."""
    spec = GPU_CACHE_TYPES[wildcards.gpu_type]
    if gpu_cache_in_job_software(wildcards.gpu_type):
        python = "python3"
    else:
        python = shlex.quote(spec.python or GPU_CACHE_SETTINGS.python or sys.executable)
    scripts = shlex.quote(str(GPU_CACHE_SCRIPTS))
    return f"PYTHONPATH={scripts}${{PYTHONPATH:+:$PYTHONPATH}} {python} -m gpu_cache.runner"


def gpu_cache_warm_threads(wildcards):
    """Threads of a warm job: one per run of the type (its shapes run side by side), or
    warm.parallel; Snakemake lowers it to --cores."""
    plan = gpu_cache_plan_phase(GPU_CACHE_SETTINGS, wildcards.gpu_type, "warm")
    return plan.parallel or max(1, len(plan.commands))


def gpu_cache_plans(*phases):
    """The runner's --plan-json arguments for these passes of a GPU type (the cold pass
    only when validate.measure_cold)."""

    def plans(wildcards):
        in_software = gpu_cache_in_job_software(wildcards.gpu_type)
        chosen = [p for p in phases if p != "cold" or GPU_CACHE_SETTINGS.validate.measure_cold]
        made = [
            gpu_cache_plan_phase(
                GPU_CACHE_SETTINGS, wildcards.gpu_type, p, record=p != "cold", in_job_software=in_software
            )
            for p in chosen
        ]
        return " ".join(f"--plan-json {shlex.quote(json.dumps(plan.as_dict()))}" for plan in made)

    return plans


def gpu_cache_config(wildcards=None):
    """The validated config, passed to the CLI (module variables cannot be used in shell:)."""
    return GPU_CACHE_CONFIG_JSON


def gpu_cache_resources():
    """Per-GPU-type SLURM resources of the warm and validate jobs, one function per resource
    name that any type sets; a type that does not set it asks for nothing (None)."""
    names = sorted({name for spec in GPU_CACHE_TYPES.values() for name in spec.resources})
    for name in set(names) & {"mem_mb", "runtime"}:
        lacking = [t for t, spec in GPU_CACHE_TYPES.items() if name not in spec.resources]
        if lacking:  # Snakemake cannot leave a size or time resource unset for one wildcard
            raise ValueError(
                f"gpu-cache config: gpu_types: {name} is set for some GPU types but not "
                f"for {', '.join(lacking)}; set it for every type or for none"
            )
    return {
        name: (lambda wildcards, name=name: GPU_CACHE_TYPES[wildcards.gpu_type].resources.get(name))
        for name in names
    }


def gpu_cache_validation(gpu_type):
    """The validation verdict of one GPU type (a host including this workflow as a module
    depends on `rules.gpu_cache_validate_cache.output.report` instead: it carries the prefix)."""
    return f"results/gpu-cache/validate/{gpu_type}.json"


def gpu_cache_validations():
    """The validation verdicts of every configured GPU type."""
    return [gpu_cache_validation(name) for name in GPU_CACHE_TYPES]


def gpu_cache_summary():
    """The end-of-run summary: requesting it runs everything, pruning included."""
    return "results/gpu-cache/summary.txt"


def gpu_cache_print_summary():
    """Print the end-of-run summary, when this run wrote one."""
    summary = Path(gpu_cache_summary())
    if summary.is_file():
        print(summary.read_text(), end="", file=sys.stderr)


def gpu_cache_pruned(wildcards):
    """prune.json, once the prune checkpoint has run."""
    return checkpoints.prune_cache.get().output.report


def gpu_cache_plots():
    """The report's plots: request them to have them in `snakemake --report`."""
    return [
        "results/gpu-cache/plots/cold_warm.svg",
        "results/gpu-cache/plots/cache_size.svg",
        "results/gpu-cache/plots/hit_rates.svg",
    ]
