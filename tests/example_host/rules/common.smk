# Helpers of the example host pipeline.

import sys

SAMPLES = config["samples"]  # sample -> {gpu_type, tokens}


def validation_of(wildcards):
    """The validation verdict of the sample's GPU type (the module's path, prefix included)."""
    return expand(
        rules.gpu_cache_validate_cache.output.report, gpu_type=SAMPLES[wildcards.sample]["gpu_type"]
    )


def gpu_resource(name):
    """A sample's SLURM resource, from its GPU type's entry in the gpu-cache config."""
    types = config["gpu_cache"]["gpu_types"]
    return lambda wildcards: types[SAMPLES[wildcards.sample]["gpu_type"]].get("resources", {}).get(name)
