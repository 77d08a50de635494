# Config validation, the cache environment, and the helpers the rules use.

import json
import os
import re
import shlex
import sys
from pathlib import Path

from snakemake.settings.types import DeploymentMethod
from snakemake.utils import min_version

min_version("9.0")

# The package lives in the checkout's scripts/ folder: importable without installation.
GPU_CACHE_SCRIPTS = Path(workflow.current_basedir).parent.parent / "scripts"
# The rules put it on PYTHONPATH, which splits at every ':' (#21): say so now, not in a rule.
if os.pathsep in str(GPU_CACHE_SCRIPTS):
    raise ValueError(
        f"gpu-cache: its checkout {GPU_CACHE_SCRIPTS.parent} has {os.pathsep!r} in its path, which "
        "PYTHONPATH cannot hold, so its rules could not import it; move it to a path without "
        f"{os.pathsep!r}"
    )
if str(GPU_CACHE_SCRIPTS) not in sys.path:
    sys.path.insert(0, str(GPU_CACHE_SCRIPTS))

from gpu_cache.jobenv import env as gpu_cache_env
from gpu_cache.core.errors import UsageError as GpuCacheUsageError
from gpu_cache.jobenv.planning import planning_only as gpu_cache_planning_only
from gpu_cache.config.host import workflow_config as gpu_cache_workflow_config
from gpu_cache.config.settings import settings_from as gpu_cache_settings_from
from gpu_cache.config import placement as gpu_cache_placement
from gpu_cache.config import targets as gpu_cache_targets
from gpu_cache.config.workloads import plan_phase as gpu_cache_plan_phase
from gpu_cache.config.workloads import cold_pass as gpu_cache_cold_pass
from gpu_cache.oci import references as gpu_cache_registry_references


def gpu_cache_stop(error):
    """Stop Snakemake with gpu-cache's one line (Snakemake's own config check printed the
    whole schema; an exception adds its file and a traceback line)."""
    sys.exit(f"gpu-cache: config: {error}")


# The schema check of gpu-cache's package (the CLI's): one line naming the key. As a module
# given the host's whole config (`config: config`), its gpu_cache: block, with {host: KEY}
# values taken from the host's keys.
try:
    GPU_CACHE_SETTINGS = gpu_cache_settings_from(gpu_cache_workflow_config(config))
except GpuCacheUsageError as error:
    gpu_cache_stop(error)

# Export at parse time: reaches every job of this workflow (and, as a module, of the host),
# local or remote, even without the gpu-cache profile. A value the user set wins. A dry run,
# --lint or a listing runs no job: it exports nothing, so it creates no cache folder.
if not gpu_cache_planning_only():
    gpu_cache_env.export(GPU_CACHE_SETTINGS)

# A type no partition offers and this machine is not fails its validation: say so before the
# run (dry run included), once, where Snakemake plans (not in each job's own parse).
if workflow.is_main_process:
    for line in gpu_cache_targets.unreachable_here(GPU_CACHE_SETTINGS):
        print(f"gpu-cache: warning: {line}", file=sys.stderr)

# As a module, this workflow must not become the host's default target: Snakemake makes the
# first rule it sees (or one marked default_target) the default. The Snakefile puts the
# host's back after its own rules (gpu_cache_join_host).
GPU_CACHE_HOST_TARGET = workflow.default_target

GPU_CACHE_TYPES = gpu_cache_targets.gpu_types(GPU_CACHE_SETTINGS)
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
    return f"PYTHONPATH={scripts}${{PYTHONPATH:+:$PYTHONPATH}} {python} -m gpu_cache.core.runner"


def gpu_cache_warm_threads(wildcards):
    """Threads of a warm job: one per run of the type (its shapes run side by side), or
    warm.parallel; Snakemake lowers it to --cores."""
    plan = gpu_cache_plan_phase(GPU_CACHE_SETTINGS, wildcards.gpu_type, "warm")
    return plan.parallel or max(1, len(plan.commands))


def gpu_cache_plans(*phases):
    """The runner's --plan-json arguments for these passes of a GPU type (the cold pass
    only when validate.measure_cold), and --unscheduled
    when an optional type's job runs no workload (gpu_cache_skip)."""

    def plans(wildcards, input, resources):
        in_software = gpu_cache_in_job_software(wildcards.gpu_type)
        attempt = getattr(resources, "gpu_cache_attempt", 1)
        skip = gpu_cache_skip(wildcards.gpu_type, input, attempt)
        cold = gpu_cache_cold_pass(GPU_CACHE_SETTINGS, wildcards.gpu_type)
        chosen = [p for p in phases if p != "cold" or cold]
        made = [
            gpu_cache_plan_phase(
                GPU_CACHE_SETTINGS, wildcards.gpu_type, p, record=p != "cold", in_job_software=in_software
            )
            for p in chosen
        ]
        args = [f"--plan-json {shlex.quote(json.dumps(plan.as_dict()))}" for plan in made]
        return " ".join(args + ([f"--unscheduled {shlex.quote(skip)}"] if skip else []))

    return plans


def gpu_cache_config(wildcards=None):
    """The validated config, passed to the CLI (module variables cannot be used in shell:)."""
    return GPU_CACHE_CONFIG_JSON


def gpu_cache_is_module():
    """Whether this workflow is included as a module of a host workflow."""
    return not workflow.modifier.is_main_snakefile()


def gpu_cache_join_host():
    """As a module: give the host back the default target it had before including this
    workflow (none yet: the host's own first rule, or its rule marked default_target, becomes
    it). Included after the host's rules (at the end of its Snakefile), join them: each rule
    of host_rules waits for every type's verdict, the prune for the inputs of the host's
    target (its final outputs), and that target builds the summary too."""
    if not gpu_cache_is_module():
        return
    workflow.default_target = GPU_CACHE_HOST_TARGET
    # Snakemake parses this workflow again for each `use rule` of it: join in the parse of
    # `use rule *` only (another imports a few rules, e.g. the prune with the host's inputs).
    if workflow.modifier.rule_whitelist is not None:
        return
    for name in GPU_CACHE_SETTINGS.host_rules:
        if not workflow.is_rule(name):
            gpu_cache_stop(
                f"config key host_rules: the host has no rule {name} above gpu-cache's module "
                "block; put the block at the end of the Snakefile, after every rule"
            )
        gpu_cache_add_input(workflow.get_rule(name), gpu_cache=gpu_cache_validations())
    if GPU_CACHE_HOST_TARGET is None:
        return  # included above the host's rules: the host wires prune and summary itself
    target = workflow.get_rule(GPU_CACHE_HOST_TARGET)
    gpu_cache_add_input(rules.prune_cache.rule, host_outputs=list(target.input))
    gpu_cache_add_input(target, gpu_cache_summary=rules.cache_report.output.summary)


def gpu_cache_add_input(to, **inputs):
    """Add named inputs to a rule defined before (Snakemake's own Rule.set_input, as its
    parser calls it; one defined without inputs has no path modifier yet, so it gets the host's)."""
    if to.input_modifier is None:
        to.input_modifier = workflow.modifier_stack[0].path_modifier
    to.set_input(**inputs)


#: Optional GPU types (the partition may lack them; by default every type that asks SLURM
#: for a place): a job of them that found no node ends "unscheduled" and holds nothing back.
GPU_CACHE_OPTIONAL = gpu_cache_placement.optional_types(GPU_CACHE_TYPES)


def gpu_cache_retries():
    """Retries of warm_cache and check_cache (gpu_cache.config.placement.retries)."""
    return gpu_cache_placement.retries(GPU_CACHE_TYPES)


def gpu_cache_skip(gpu_type, input, attempt):
    """Why a warm or check job runs no workload (None: it runs them; placement.skip_reason)."""
    warm = getattr(input, "warm", None)
    return gpu_cache_placement.skip_reason(gpu_type, GPU_CACHE_TYPES[gpu_type], warm, attempt)


def gpu_cache_resources(phase):
    """Per-GPU-type SLURM resources of the warm or check jobs (``phase``), one function per
    resource name (gpu_cache.config.placement): an optional type's jobs carry a --deadline
    where the type sets its runtime, ask for no GPU when they run no workload
    (gpu_cache_skip), and get the memory of the runs they make at once where it is known."""
    try:
        types = gpu_cache_placement.sized(GPU_CACHE_SETTINGS, GPU_CACHE_TYPES, phase)
        names = gpu_cache_placement.resource_names(types)
    except GpuCacheUsageError as error:
        gpu_cache_stop(error)

    def resource(name):
        def value(wildcards, input, attempt):
            skipped = lambda: gpu_cache_skip(wildcards.gpu_type, input, attempt) is not None
            return gpu_cache_placement.resource(name, types[wildcards.gpu_type], skipped)

        return value

    out = {name: resource(name) for name in names}
    if GPU_CACHE_OPTIONAL:  # the attempt, for the command (params cannot see it)
        out["gpu_cache_attempt"] = lambda wildcards, attempt: attempt
    return out


def gpu_cache_validations():
    """The validation verdicts of every configured GPU type (a host including this workflow
    as a module expands `rules.gpu_cache_validate_cache.output.report` itself)."""
    return expand(rules.validate_cache.output.report, gpu_type=list(GPU_CACHE_TYPES))


def gpu_cache_print_summary():
    """Print the end-of-run summary, when this run wrote one."""
    summary = Path(rules.cache_report.output.summary)
    if summary.is_file():
        print(summary.read_text(), end="", file=sys.stderr)


def gpu_cache_pruned(wildcards):
    """prune.json, once the prune checkpoint has run."""
    return checkpoints.prune_cache.get().output.report


def gpu_cache_fetch_ref(wildcards):
    """The pack this GPU type's warm step starts from (config registry.fetch; None: none)."""
    return gpu_cache_registry_references(GPU_CACHE_SETTINGS.config, wildcards.gpu_type)[0]


def gpu_cache_publish_ref(wildcards):
    """The tag this GPU type's validated entries go to (config registry.publish; None: none)."""
    return gpu_cache_registry_references(GPU_CACHE_SETTINGS.config, wildcards.gpu_type)[1]


def gpu_cache_fetched(wildcards):
    """The fetch report warm_cache waits for, where the type fetches a pack (else nothing)."""
    if gpu_cache_fetch_ref(wildcards) is None:
        return []
    return expand(rules.fetch_cache.output.report, gpu_type=wildcards.gpu_type)


def gpu_cache_fetch_target(wildcards):
    """Whose software the fetched pack must fit: the type's image where warm runs in it, else
    the Python its workloads run with (a conda environment: Snakemake's own Python)."""
    spec = GPU_CACHE_TYPES[wildcards.gpu_type]
    if spec.container and gpu_cache_in_job_software(wildcards.gpu_type):
        return f"--image {shlex.quote(spec.container)}"
    if spec.conda and gpu_cache_in_job_software(wildcards.gpu_type):
        return ""
    return f"--python {shlex.quote(spec.python or GPU_CACHE_SETTINGS.python or sys.executable)}"


def gpu_cache_published():
    """The publish reports of the types that publish (config registry.publish)."""
    publishing = [
        name for name in GPU_CACHE_TYPES if gpu_cache_registry_references(GPU_CACHE_SETTINGS.config, name)[1]
    ]
    return expand(rules.publish_cache.output.report, gpu_type=publishing)
