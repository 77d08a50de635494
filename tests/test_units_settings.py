"""Sizes, ages, config validation and the cache root's resolution."""

from pathlib import Path

import pytest

from gpu_cache.config.settings import resolve_cache_root, settings_from, validate_config
from gpu_cache.config.units import format_size, parse_age, parse_size
from gpu_cache.core.errors import UsageError


@pytest.mark.parametrize("text,expected", [
    ("10G", 10 << 30), ("500M", 500 << 20), ("1.5K", 1536), ("4096", 4096), ("20GiB", 20 << 30),
    ("2t", 2 << 40), (0, 0), (123, 123),
])
def test_sizes_parse_to_bytes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["10X", "G", "-1G", "", "1e10", -5, True])
def test_bad_sizes_are_refused_with_the_fix(text):
    with pytest.raises(UsageError, match="10G"):
        parse_size(text)


@pytest.mark.parametrize("text,expected", [("30d", 30 * 86400), ("12h", 43200), ("15m", 900),
                                           ("90s", 90), ("2w", 14 * 86400), ("45", 45)])
def test_ages_parse_to_seconds(text, expected):
    assert parse_age(text) == expected


@pytest.mark.parametrize("text", ["30y", "d", "-3d", "soon"])
def test_bad_ages_are_refused(text):
    with pytest.raises(UsageError, match="30d"):
        parse_age(text)


def test_format_size_is_short():
    assert format_size(0) == "0 B" and format_size(1536) == "1.5 KiB" and format_size(10 << 30) == "10.0 GiB"


def test_cache_root_precedence(tmp_path):
    env = {"HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "xdg"),
           "GPU_CACHE_ROOT": str(tmp_path / "env")}
    assert resolve_cache_root("/explicit", env) == Path("/explicit")
    assert resolve_cache_root(None, env) == tmp_path / "env"
    del env["GPU_CACHE_ROOT"]
    assert resolve_cache_root(None, env) == tmp_path / "xdg" / "gpu-cache"
    del env["XDG_CACHE_HOME"]
    assert resolve_cache_root(None, env) == tmp_path / "home" / ".cache" / "gpu-cache"
    assert resolve_cache_root("~/c", env) == tmp_path / "home" / "c"


def test_relative_root_becomes_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_cache_root("rel/cache", {}) == tmp_path / "rel" / "cache"


@pytest.mark.parametrize("word", ["none", "off", "false", "", "NONE", " Off "])
def test_off_words_turn_caching_off(word):
    assert resolve_cache_root(word, {}) is None
    assert resolve_cache_root(None, {"GPU_CACHE_ROOT": word}) is None


def test_defaults_are_filled_for_every_key():
    config = validate_config({})
    assert config["prune"] == {"max_size": "10G", "max_age": "30d", "dry_run": False}
    assert config["validate"] == {"measure_cold": True, "strict": False, "outputs": "identical",
                                  "outputs_tolerance": 0.01}
    assert config["xla_caches"] == "none" and config["default_workloads"] == ["jax-transformer"]
    with_workload = validate_config({"workloads": {"mine": {"command": "true"}}})
    assert with_workload["workloads"]["mine"]["timeout"] == "2h"


def test_every_schema_key_has_a_description_and_default():
    from gpu_cache.config.settings import load_schema

    def walk(schema, where):
        for key, sub in schema.get("properties", {}).items():
            assert "description" in sub, f"{where}{key} has no description"
            unset_means_not_requested = where.endswith("resources.")  # SLURM asks for nothing then
            if (where == "" or "default" in schema) and not unset_means_not_requested:
                assert "default" in sub or key in ("command", "shapes", "workloads"), f"{where}{key}"
            walk(sub, f"{where}{key}.")
            if isinstance(sub.get("additionalProperties"), dict):
                walk(sub["additionalProperties"], f"{where}{key}.*.")

    walk(load_schema(), "")


def test_config_readme_has_a_row_for_every_key_of_the_schema():
    """config/README.md's table names every key the schema has (a top-level key, or one of the
    settings mappings such as warm.* and validate.*; gpu_types and workloads are rows of their
    own whose keys they explain)."""
    import re

    from gpu_cache.config.settings import load_schema
    from helpers import REPO

    keys = []
    for key, sub in load_schema()["properties"].items():
        nested = sub.get("properties") if key not in ("gpu_types", "workloads") else None
        keys += [f"{key}.{inner}" for inner in nested] if nested else [key]
    rows = set(re.findall(r"^\| `([^`]+)` \|", (REPO / "config" / "README.md").read_text(), re.MULTILINE))
    assert [key for key in keys if key not in rows] == []


@pytest.mark.parametrize("config,where", [
    ({"bogus": 1}, "bogus"), ({"prune": {"max_size": "10X"}}, "prune.max_size"),
    ({"prune": {"max_age": "-1d"}}, "prune.max_age"), ({"stats_hook": "yes"}, "stats_hook"),
    ({"gpu_types": {"a100": {"gpus": -1}}}, "gpu_types.a100.gpus"),
    ({"workloads": {"x": {"shapes": [1]}, }, "gpu_types": {}}, None),
])
def test_bad_config_names_the_key(config, where):
    if where is None:  # a workload without a command is only an error when it is used
        settings_from(config)
        return
    with pytest.raises(UsageError, match=where.replace(".", r"\.")):
        validate_config(config)


@pytest.mark.parametrize("config, where", [
    ({"gpu_types": {"a100\n": {}}}, "gpu_types"),
    ({"gpu_types": {"a100": {"workloads": ["jax-transformer\n"]}}}, "gpu_types.a100.workloads.0"),
    ({"default_workloads": ["jax-transformer\n"]}, "default_workloads.0"),
    ({"triton_targets": ["sm_90\n"]}, "triton_targets.0"),
    ({"shared_group": "team\n"}, "shared_group"),
])
def test_a_name_that_ends_in_a_newline_is_refused_in_one_line(config, where):
    # jsonschema's re.search lets "$" match before a final newline: the whole value must match
    with pytest.raises(UsageError) as error:
        validate_config(config)
    assert str(error.value).startswith(f"config key {where}:")
    assert "\n" not in str(error.value)


def test_the_gpu_type_name_rule_is_the_schemas():
    from gpu_cache.config.settings import load_schema
    from gpu_cache.config.targets import GPU_TYPE_NAME

    pattern = load_schema()["properties"]["gpu_types"]["propertyNames"]["pattern"]
    assert pattern == f"^{GPU_TYPE_NAME.pattern}$"
