# Config validation, the cache environment, and the helpers the rules use.

import dataclasses
import json
import os
import re
import shlex
import sys
from pathlib import Path

from snakemake.settings.types import DeploymentMethod
from snakemake.utils import min_version

min_version("9.0")

from gpu_cache import DEFAULT_CONFIG_FILE as GPU_CACHE_DEFAULT_CONFIG_FILE
from gpu_cache.core import PACKAGE_PARENT as GPU_CACHE_PACKAGE_PARENT
from gpu_cache.jobenv import env as gpu_cache_env
from gpu_cache.core.errors import UsageError as GpuCacheUsageError
from gpu_cache.core.shown import shown as gpu_cache_shown
from gpu_cache.config.settings import read_config_file as gpu_cache_read_config_file
from gpu_cache.jobenv.planning import planning_only as gpu_cache_planning_only
from gpu_cache.config.host import workflow_settings as gpu_cache_workflow_settings
from gpu_cache.config import host_join as gpu_cache_host_join
from gpu_cache.config import placement as gpu_cache_placement
from gpu_cache.config import cluster as gpu_cache_cluster
from gpu_cache.config import targets as gpu_cache_targets
from gpu_cache.config.workloads import plan_phase as gpu_cache_plan_phase
from gpu_cache.config.workloads import cold_pass as gpu_cache_cold_pass
from gpu_cache.oci import references as gpu_cache_registry_references


def gpu_cache_stop(error):
    """Stop Snakemake with gpu-cache's one line (Snakemake's own config check printed the
    whole schema; an exception adds its file and a traceback line), what the user wrote in it
    escaped (a newline would split it, ESC or CR drive the terminal)."""
    sys.exit(gpu_cache_shown(f"gpu-cache: config: {error}"))


# The package's folder (it holds nothing else: a checkout's scripts/, an installed wheel's
# site-packages/gpu-cache) goes on the rules' PYTHONPATH: the code this workflow imported
# (package.smk) is what its jobs run, also with another Python than Snakemake's. PYTHONPATH
# splits at every ':' (#21): say so now, not in a rule.
if os.pathsep in str(GPU_CACHE_PACKAGE_PARENT):
    sys.exit(
        gpu_cache_shown(
            f"gpu-cache: it is installed under {GPU_CACHE_PACKAGE_PARENT}, whose path holds {os.pathsep!r}, "
            "which PYTHONPATH cannot hold, so its rules could not import it; install it under a path "
            f"without {os.pathsep!r}"
        )
    )


# The working directory's config/config.yaml, else the embedded default of the package (so
# `snakemake --snakefile <checkout>/workflow/Snakefile` runs from any folder). gpu-cache
# reads it before Snakemake merges it: that merge copies every mapping a YAML alias repeats (a
# 1 KB file held it for minutes) and recurses without end into one that contains itself. (As
# a module given the host's config, Snakemake skips this file; files given with --configfile
# it reads before this workflow starts.)
GPU_CACHE_CONFIGFILE = (
    "config/config.yaml" if os.path.exists("config/config.yaml") else str(GPU_CACHE_DEFAULT_CONFIG_FILE)
)
if not workflow.modifier.skip_configfile:
    try:
        gpu_cache_read_config_file(GPU_CACHE_CONFIGFILE)
    except GpuCacheUsageError as error:
        gpu_cache_stop(error)


configfile: GPU_CACHE_CONFIGFILE


# The schema check of gpu-cache's package (the CLI's): one line naming the key (by its whole
# path, gpu_cache.host_rule). As a module given the host's whole config (`config: config`), its
# gpu_cache: block, with {host: KEY} values taken from the host's keys.
try:
    GPU_CACHE_SETTINGS = gpu_cache_workflow_settings(config)
except GpuCacheUsageError as error:
    gpu_cache_stop(error)

# Export at parse time: reaches every job of this workflow (and, as a module, of the host),
# local or remote, even without the gpu-cache profile. A value the user set wins. A dry run,
# --lint or a listing runs no job: it exports nothing, so it creates no cache folder.
if not gpu_cache_planning_only():
    gpu_cache_env.export(GPU_CACHE_SETTINGS)
elif workflow.is_main_process:  # it exports nothing: it says what env would of an unusable root
    for line in gpu_cache_env.root_lines(GPU_CACHE_SETTINGS):
        print(gpu_cache_shown(f"gpu-cache: warning: {line}"), file=sys.stderr)

# A type no node can take as a node of its type, and this machine is not, fails its validation:
# say so before the run (dry run included), once, where Snakemake plans (not in each job's parse).
if workflow.is_main_process:
    for line in gpu_cache_cluster.unreachable_here(GPU_CACHE_SETTINGS):
        print(gpu_cache_shown(f"gpu-cache: warning: {line}"), file=sys.stderr)
    # A mem_mb or a bucket no node can take: its jobs are refused, or the bucket is left out.
    try:
        for line in gpu_cache_placement.sizing_problems(GPU_CACHE_SETTINGS):
            print(gpu_cache_shown(f"gpu-cache: PROBLEM: {line}"), file=sys.stderr)
    except GpuCacheUsageError as error:
        gpu_cache_stop(error)

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
    package = shlex.quote(str(GPU_CACHE_PACKAGE_PARENT))
    return f"PYTHONPATH={package}${{PYTHONPATH:+:$PYTHONPATH}} {python} -m gpu_cache"


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
    package = shlex.quote(str(GPU_CACHE_PACKAGE_PARENT))
    return f"PYTHONPATH={package}${{PYTHONPATH:+:$PYTHONPATH}} {python} -m gpu_cache.core.runner"


def gpu_cache_planned(wildcards, input):
    """How this type's warm and check jobs are planned (gpu_cache.config.placement.planned): as
    the preflight wrote it once it has run, so that Snakemake and the job's own process agree;
    before (a dry run), planned here once per type."""
    preflight = getattr(input, "preflight", None)
    if preflight and os.path.isfile(preflight):
        return gpu_cache_placement.planned_in(preflight, GPU_CACHE_SETTINGS, wildcards.gpu_type)
    if wildcards.gpu_type not in GPU_CACHE_PLANNED_HERE:
        GPU_CACHE_PLANNED_HERE[wildcards.gpu_type] = gpu_cache_placement.planned(
            GPU_CACHE_SETTINGS, wildcards.gpu_type
        )
    return GPU_CACHE_PLANNED_HERE[wildcards.gpu_type]


#: The plans made in this process before the preflight had run (by GPU type).
GPU_CACHE_PLANNED_HERE = {}


def gpu_cache_warm_threads(wildcards, input, attempt):
    """Threads of a warm job: the runs it makes at once (those that fit its memory, at most
    warm.parallel; else one per run: its shapes side by side), one when it runs no workload;
    Snakemake lowers it to --cores."""
    planned = gpu_cache_planned(wildcards, input)
    if planned["skip"] or gpu_cache_skip(wildcards.gpu_type, input, attempt):
        return 1
    plan = gpu_cache_plan_phase(GPU_CACHE_SETTINGS, wildcards.gpu_type, "warm")
    return planned["warm_parallel"] or max(1, len(plan.commands))


def gpu_cache_plans(*phases, confirm_warm=False):
    """The runner's --plan-json arguments for these passes of a GPU type (the cold pass only when
    validate.measure_cold), and --unscheduled or --skip when
    the job runs no workload (gpu_cache_skip; a warm planned to run none). ``confirm_warm``: a
    check whose warm was planned to run none warms first, one run at a time, where the passed
    verdict that planned it does not hold on its node (other software or device)."""

    def plans(wildcards, input, resources):
        gpu_type = wildcards.gpu_type
        attempt = getattr(resources, "gpu_cache_attempt", 1)
        skip = gpu_cache_skip(gpu_type, input, attempt)
        planned = gpu_cache_planned(wildcards, input)
        chosen = [p for p in phases if p != "cold" or gpu_cache_cold_pass(GPU_CACHE_SETTINGS, gpu_type)]
        if confirm_warm and gpu_cache_warm_was_skipped(input):
            chosen.insert(0, "warm")
        made = []
        for phase in chosen:
            plan = gpu_cache_placement.job_plan(
                GPU_CACHE_SETTINGS,
                gpu_type,
                phase,
                planned,
                record=phase != "cold",
                in_job_software=gpu_cache_in_job_software(gpu_type),
            )
            if phase == "warm":  # those that fit its memory at once (checks: one at a time)
                plan = dataclasses.replace(plan, parallel=1 if confirm_warm else planned["warm_parallel"])
            made.append(plan)
        args = [f"--plan-json {shlex.quote(json.dumps(plan.as_dict()))}" for plan in made]
        if skip:
            args.append(f"--unscheduled {shlex.quote(skip)}")
        elif phases == ("warm",) and planned["skip"]:
            args.append(f"--skip {shlex.quote(planned['skip'])}")
        return " ".join(args)

    return plans


def gpu_cache_warm_was_skipped(input):
    """Whether this check's warm job ran no workload because the host planned it so."""
    try:
        with open(input.warm) as stream:
            return bool(json.load(stream).get("skipped"))
    except (OSError, ValueError, AttributeError):
        return False


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
        host_rule = workflow.get_rule(name)
        gpu_cache_add_input(host_rule, gpu_cache=gpu_cache_validations())
        # Its own --jax_compilation_cache_dir, where it passes one, is gpu-cache's folder.
        gpu_cache_host_join.point_rule_params(host_rule.params)
    if workflow.is_main_process:  # an older README's settings in the host's own config file
        for path in [f for f in workflow.configfiles if f not in workflow.overwrite_configfiles]:
            dropped = gpu_cache_host_join.dropped_arguments(str(path))
            if dropped:  # every host job would lose arguments: stop before any job
                gpu_cache_stop(dropped)
            try:
                line = gpu_cache_host_join.pasted_settings(str(path), gpu_cache_read_config_file(path))
            except GpuCacheUsageError:
                line = None
            if line:
                print(gpu_cache_shown(f"gpu-cache: warning: {line}"), file=sys.stderr)
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
    where the type sets its runtime, ask for no GPU and little memory when they run no workload
    (gpu_cache_skip, a planned skip of the warm), and get the memory of the runs they make at
    once where it is known."""
    try:
        types = gpu_cache_placement.sized(GPU_CACHE_SETTINGS, GPU_CACHE_TYPES, phase)
        names = gpu_cache_placement.resource_names(types)
    except GpuCacheUsageError as error:
        gpu_cache_stop(error)

    def resource(name):
        def value(wildcards, input, attempt):
            def skipped():
                if phase == "warm" and gpu_cache_planned(wildcards, input)["skip"]:
                    return True
                return gpu_cache_skip(wildcards.gpu_type, input, attempt) is not None

            spec = types[wildcards.gpu_type]
            planned = gpu_cache_planned(wildcards, input)[f"{phase}_mb"] if name == "mem_mb" else None
            if planned and "mem_mb" not in GPU_CACHE_TYPES[wildcards.gpu_type].resources:
                spec = dataclasses.replace(spec, resources={**spec.resources, "mem_mb": planned})
            return gpu_cache_placement.resource(name, spec, skipped)

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
