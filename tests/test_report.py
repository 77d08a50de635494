"""`snakemake --report` on a finished run: the plots and their captions are in the report."""

import base64

import pytest

from helpers import PROFILE, REPO, SMALL, SNAKEFILE, clean_environ, run_snakemake, workdir_with_config

pytestmark = pytest.mark.slow  # every test here runs JAX or Snakemake for seconds

PLOTS = ("cold_warm.svg", "cache_size.svg", "hit_rates.svg")
CAPTIONS = ("**Cold vs warm start.**", "**Cache size per kind, before and after pruning.**",
            "**Cache hit rate per rule.**")


def test_the_report_holds_the_three_plots_with_captions(tmp_path):
    work = workdir_with_config(tmp_path, SMALL)
    env = clean_environ(GPU_CACHE_ROOT=str(tmp_path / "cache"))
    run = run_snakemake(work, "-s", SNAKEFILE, "--profile", PROFILE, "--cores", "2", env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    plots = work / "results" / "gpu-cache" / "plots"
    cold_warm = (plots / "cold_warm.svg").read_text()
    assert "cpu / jax-transformer" in cold_warm and "faster)" in cold_warm  # cold and warm measured
    hit_rates = (plots / "hit_rates.svg").read_text()
    assert "validate_cache" in hit_rates and "warm_cache" in hit_rates
    assert "jax" in (plots / "cache_size.svg").read_text()

    made = run_snakemake(work, "-s", SNAKEFILE, "--profile", PROFILE, "--report", "report.html", env=env)
    assert made.returncode == 0, made.stderr[-3000:]
    html = (work / "report.html").read_text()
    for name in PLOTS:
        assert f"results/gpu-cache/plots/{name}" in html
        embedded = base64.b64encode((plots / name).read_bytes()).decode()
        assert embedded in html, f"{name} is not embedded in the report"
    for caption_file, start in zip(("cold_warm", "cache_size", "hit_rates"), CAPTIONS, strict=True):
        text = (REPO / "workflow" / "report" / f"{caption_file}.rst").read_text()
        assert text.startswith(start)
        # Snakemake renders the reST caption to HTML: its plain first words are in the report.
        assert start.strip("*") in html
