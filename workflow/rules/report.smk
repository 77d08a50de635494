# The report's plots: `snakemake --report report.html` after a run shows them with captions.
# The rule calls the package (`gpu-cache plots`); captions live in ../report/.


rule cache_plots:
    input:
        validations=gpu_cache_validations(),
        prune=gpu_cache_pruned,
    output:
        cold_warm=report(
            "results/gpu-cache/plots/cold_warm.svg",
            caption="../report/cold_warm.rst",
            category="gpu-cache",
        ),
        cache_size=report(
            "results/gpu-cache/plots/cache_size.svg",
            caption="../report/cache_size.rst",
            category="gpu-cache",
        ),
        hit_rates=report(
            "results/gpu-cache/plots/hit_rates.svg",
            caption="../report/hit_rates.rst",
            category="gpu-cache",
        ),
    log:
        "logs/gpu-cache/plots.log",
    conda:
        "../envs/gpu-cache.yaml"
    params:
        cli=gpu_cache_cli,
        config=gpu_cache_config,
    shell:
        "{params.cli} plots --config-json {params.config:q} --validate {input.validations}"
        ' --prune {input.prune} --outdir "$(dirname {output.cold_warm:q})" > {log} 2>&1'
