# The cache rules, in pipeline order: preflight, warm, check, validate, prune (last), report.
# Each calls the gpu_cache CLI, or its workload runner in the jobs' own software (warm and
# check); all logic lives in the package.


rule preflight_cache:
    output:
        report="results/gpu-cache/preflight.json",
    log:
        "logs/gpu-cache/preflight.log",
    # Cheap bookkeeping: runs where Snakemake runs, not on a GPU node.
    localrule: True
    conda:
        "../envs/gpu-cache.yaml"
    params:
        cli=gpu_cache_cli,
        config=gpu_cache_config,
    shell:
        "{params.cli} doctor --config-json {params.config:q} --no-fail --output {output.report} > {log} 2>&1"


rule fetch_cache:
    input:
        preflight=rules.preflight_cache.output.report,
    output:
        report="results/gpu-cache/fetch/{gpu_type}.json",
    log:
        "logs/gpu-cache/fetch/{gpu_type}.log",
    # Where Snakemake runs (a login node reaches the registry), into the cache root; a
    # registry that fails or a pack that is refused is a warning, and warm compiles it all.
    localrule: True
    conda:
        "../envs/gpu-cache.yaml"
    params:
        cli=gpu_cache_cli,
        config=gpu_cache_config,
        reference=gpu_cache_fetch_ref,
        target=gpu_cache_fetch_target,
    shell:
        "{params.cli} fetch {params.reference:q} --gpu-type {wildcards.gpu_type} {params.target}"
        " --config-json {params.config:q} --no-fail --output {output.report} 2> {log}"


rule warm_cache:
    input:
        preflight=rules.preflight_cache.output.report,
        fetched=gpu_cache_fetched,
    output:
        report="results/gpu-cache/warm/{gpu_type}.json",
    log:
        "logs/gpu-cache/warm/{gpu_type}.log",
    # An optional type's job that found no node is retried once as "unscheduled".
    retries: gpu_cache_retries()
    conda:
        gpu_cache_conda
    # The jobs' own software, where the GPU type names it: the runner needs only Python.
    container:
        gpu_cache_container
    # The type's runs (shapes) compile side by side, as many as fit its memory: Triton's
    # compiles use one core each.
    threads: gpu_cache_warm_threads
    # Runs on a node of its GPU type, with the type's SLURM resources (config gpu_types).
    resources:
        **gpu_cache_resources("warm"),
    params:
        runner=gpu_cache_runner,
        plans=gpu_cache_plans("warm"),
    shell:
        "{params.runner} {params.plans} --threads {threads} --output {output.report} --log {log}"


rule check_cache:
    input:
        preflight=rules.preflight_cache.output.report,
        warm=rules.warm_cache.output.report,
    output:
        passes="results/gpu-cache/check/{gpu_type}.json",
    log:
        "logs/gpu-cache/check/{gpu_type}.log",
    # An optional type's job that found no node is retried once as "unscheduled".
    retries: gpu_cache_retries()
    conda:
        gpu_cache_conda
    # The same software as warm_cache: fresh processes of the jobs' software must hit.
    container:
        gpu_cache_container
    # Runs on a node of its GPU type, with the type's SLURM resources (config gpu_types).
    resources:
        **gpu_cache_resources("check"),
    params:
        runner=gpu_cache_runner,
        plans=gpu_cache_plans("cold", "validate", confirm_warm=True),
    shell:
        "{params.runner} {params.plans} --output {output.passes} --log {log}"


rule validate_cache:
    input:
        passes=rules.check_cache.output.passes,
        warm=rules.warm_cache.output.report,
        preflight=rules.preflight_cache.output.report,
    output:
        report="results/gpu-cache/validate/{gpu_type}.json",
    log:
        "logs/gpu-cache/validate/{gpu_type}.log",
    # Cheap bookkeeping: judges what check_cache measured, where Snakemake runs (and asks SLURM
    # why, when a job did not run on a node of its type).
    localrule: True
    conda:
        "../envs/gpu-cache.yaml"
    params:
        cli=gpu_cache_cli,
        config=gpu_cache_config,
    shell:
        "{params.cli} validate --gpu-type {wildcards.gpu_type} --config-json {params.config:q}"
        " --phases {input.passes} --warm {input.warm} --preflight {input.preflight}"
        " --output {output.report} 2> {log}"


rule publish_cache:
    input:
        verdict=rules.validate_cache.output.report,
    output:
        report="results/gpu-cache/publish/{gpu_type}.json",
    log:
        "logs/gpu-cache/publish/{gpu_type}.log",
    # Where Snakemake runs; only a passed verdict is published, and a failure is a warning.
    localrule: True
    conda:
        "../envs/gpu-cache.yaml"
    params:
        cli=gpu_cache_cli,
        config=gpu_cache_config,
        reference=gpu_cache_publish_ref,
    shell:
        "{params.cli} publish {params.reference:q} --gpu-type {wildcards.gpu_type} --verdict {input.verdict}"
        " --config-json {params.config:q} --no-fail --output {output.report} 2> {log}"


# A checkpoint whose inputs are everything else, so it runs last; a host overrides its
# input with its own final outputs (`use rule prune_cache ... with: input: ...`).
checkpoint prune_cache:
    input:
        validations=gpu_cache_validations(),
        published=gpu_cache_published(),
    output:
        report="results/gpu-cache/prune.json",
    log:
        "logs/gpu-cache/prune.log",
    # Cheap bookkeeping: runs where Snakemake runs, not on a GPU node.
    localrule: True
    conda:
        "../envs/gpu-cache.yaml"
    params:
        cli=gpu_cache_cli,
        config=gpu_cache_config,
    shell:
        "{params.cli} prune --no-fail --config-json {params.config:q} --output {output.report} 2> {log}"


rule cache_report:
    input:
        validations=gpu_cache_validations(),
        prune=gpu_cache_pruned,
    output:
        summary="results/gpu-cache/summary.txt",
    log:
        "logs/gpu-cache/summary.log",
    # Cheap bookkeeping: runs where Snakemake runs, not on a GPU node.
    localrule: True
    conda:
        "../envs/gpu-cache.yaml"
    params:
        cli=gpu_cache_cli,
    # Fails (after printing the summary) when a GPU type's workloads could not even start.
    shell:
        "{params.cli} summary --validate {input.validations} --prune {input.prune}"
        " --output {output.summary} 2> {log} || {{ cat {log} >&2; exit 1; }}"
