"""A config cannot hang or crash gpu-cache (#46): YAML aliases that repeat one another (a
"billion laughs" of 1 KB), an anchor used inside itself and nesting deeper than YAML reads are
one line, at once, wherever a config is read: the CLI's --config (gpu-cache's own file and a host's
gpu_cache: block), the workflow's config/config.yaml and Snakemake's --configfile (the block
and the host's keys that {host: KEY} names). What the user wrote is printed escaped, on one
line. Real CLI processes and real `snakemake -n` runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_cache.config import expansion
from gpu_cache.core.errors import UsageError
from helpers import SNAKEFILE, clean_environ, run_cli, run_snakemake

#: Text a key or value may hold that no error line may pass on raw.
HOSTILE = "x\x1b[2J\rforged: PASSED\nline"
ESCAPED = "x\\x1b[2J\\x0dforged: PASSED\\x0aline"
#: It in YAML (a JSON string is a YAML one).
QUOTED = json.dumps(HOSTILE)


def list_bomb(levels: int = 9, indent: str = "") -> str:
    """YAML anchors, each a list of nine aliases of the one before: 9**levels strings."""
    lines = [f"{indent}l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"{indent}l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 9)}]" for n in range(1, levels)]
    return "\n".join(lines) + "\n"


def mapping_bomb(levels: int = 9, indent: str = "") -> str:
    """The same with mappings (Snakemake's own merge copies each one it meets)."""
    lines = [f"{indent}m0: &m0 {{{', '.join(f'k{k}: 1' for k in range(9))}}}"]
    lines += [f"{indent}m{n}: &m{n} {{{', '.join(f'k{k}: *m{n - 1}' for k in range(9))}}}"
              for n in range(1, levels)]
    return "\n".join(lines) + "\n"


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


#: A long value in a config of 0.4 MB, anchored as ``s``: a string, a mapping that holds it (its
#: text counted into every alias of the mapping), a number of 4,000 digits.
LONG = {"a string": f"&s '{'x' * 400_000}'", "a mapping holding it": f"&s {{a: {{b: ['{'x' * 400_000}']}}}}",
        "a number": f"&s {'9' * 4000}"}


def long_aliases(value: str, count: int) -> str:
    """A config of the long ``value`` and ``count`` aliases of it where the schema wants one
    text: ``count`` values, but ``count`` times the value's text."""
    return (f"workloads: {{w: {{args: [{value}]}}}}\n"
            f"gpu_types: {{a100: {{container: [{', '.join(['*s'] * count)}]}}}}\n")


#: gpu-cache's own config files, each a few hundred bytes: (the file, what its one line says).
OWN = {
    "a list bomb in gpu_types": ("gpu_types:\n" + list_bomb(indent="  "),
                                 "expands to more than 1048576 values: YAML aliases that repeat one another"),
    "a mapping bomb in gpu_types": ("gpu_types:\n" + mapping_bomb(indent="  "),
                                    "expands to more than 1048576 values"),
    "an anchor inside itself": ("gpu_types: &t {a100: {more: *t}}\n",
                                "config key gpu_types.a100.more contains itself (a YAML alias inside its "
                                "own anchor): write the value out"),
    "deeper than YAML reads": (f"gpu_types: {nested(1000)}\n", "nests deeper than YAML can be read"),
    "deeper than a config": (f"gpu_types: {nested(200)}\n", "config key gpu_types.0.0.0... nests deeper than "
                             "100 levels of mappings and lists; a config has a few"),
}
#: The same inside a host's config: gpu-cache's gpu_cache: block, or a host's key it names.
HOST = {
    "a list bomb in the gpu_cache block": ("prediction_container: x\ngpu_cache:\n  gpu_types:\n"
                                           + list_bomb(indent="    "), "expands to more than"),
    "an anchor inside itself in the block": (
        "gpu_cache: &g\n  gpu_types: {a100: {resources: {x: *g}}}\n",
        "config key gpu_cache.gpu_types.a100.resources.x contains itself"),
}


def one_line(done: subprocess.CompletedProcess[str], code: int) -> str:
    assert done.returncode == code, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "RecursionError" not in done.stderr, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines[:5]
    return lines[0]


@pytest.mark.parametrize("case", [*OWN, *HOST])
def test_a_config_file_that_expands_without_end_is_one_line_at_once(case, tmp_path):
    """The CLI: ``env --config`` (every command reads --config so) fails in a fraction of a
    second instead of copying billions of values (it held `env` past 60 s) or recursing until
    Python stops it (3,002 lines of RecursionError)."""
    text, said = {**OWN, **HOST}[case]
    assert len(text.encode()) < 5000
    config = tmp_path / "config.yaml"
    config.write_text(text)
    done = run_cli("env", "--config", str(config), "--cache-root", str(tmp_path / "c"), timeout=60)
    line = one_line(done, 2)
    assert line.startswith(f"gpu-cache: error: config file {config}") and said in line, line


@pytest.mark.parametrize("case", ["a mapping bomb in gpu_types", "an anchor inside itself"])
def test_two_config_files_that_expand_without_end_are_one_line_before_they_are_merged(case, tmp_path):
    """Merged as Snakemake merges them, two files walk each other's mappings (each alias of
    one against each of the other): each file is measured as it is read."""
    text, said = OWN[case]
    files = [tmp_path / "config.yaml", tmp_path / "gpu-cache.yaml"]
    for path in files:
        path.write_text(text)
    done = run_cli("env", *(arg for path in files for arg in ("--config", str(path))),
                   "--cache-root", str(tmp_path / "c"), timeout=60)
    line = one_line(done, 2)
    assert line.startswith(f"gpu-cache: error: config file {files[0]}") and said in line, line


def workflow_run(tmp_path: Path, config: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """``snakemake -n`` of gpu-cache's workflow in a folder whose config/config.yaml is
    ``config``, and ``extra`` arguments."""
    work = tmp_path / "work"
    (work / "config").mkdir(parents=True)
    (work / "config" / "config.yaml").write_text(config)
    return run_snakemake(work, "-s", SNAKEFILE, "-n", *extra, timeout=120,
                         env=clean_environ(GPU_CACHE_ROOT=str(tmp_path / "cache")))


@pytest.mark.slow
@pytest.mark.parametrize("case", ["a mapping bomb in gpu_types", "an anchor inside itself",
                                  "deeper than YAML reads", "deeper than a config"])
def test_the_workflows_config_file_is_read_by_gpu_cache_before_snakemake_merges_it(case, tmp_path):
    """Snakemake's merge of a config file copies every mapping an alias repeats (it held the
    dry run past 30 s) and recurses without end into one that holds itself: gpu-cache reads
    config/config.yaml first."""
    text, said = OWN[case]
    line = one_line(workflow_run(tmp_path, text), 1)
    assert line.startswith("gpu-cache: config: config file config/config.yaml") and said in line, line


#: Files given with --configfile (Snakemake reads them itself): a list bomb passes its merge.
NAMED = "gpu_cache:\n  gpu_types: {{a100: {{resources: {{host: {}}}}}}}\n"  # a host's key, by reference
CONFIGFILES = {
    "in gpu-cache's own keys": (
        "gpu_types:\n" + list_bomb(indent="  "),
        "gpu-cache: config: the workflow's config expands to more than 100000 values"),
    "in the gpu_cache block": (
        "gpu_cache:\n  gpu_types:\n" + list_bomb(indent="    "),
        "gpu-cache: config: the workflow's config (config key gpu_cache) expands to more than 100000 values"),
    "in a host's key the block names": (
        list_bomb() + NAMED.format("l8"),
        "gpu-cache: config: the config expands to more than 100000 values"),
    "a host's list that holds itself": (
        "loop: &l [*l]\n" + NAMED.format("loop"),
        "gpu-cache: config: the config: config key gpu_types.a100.resources.0 contains itself"),
    "aliases of one long string": (
        long_aliases(LONG["a string"], 2000),
        "gpu-cache: config: the workflow's config expands to more than 1048576 characters of text"),
    "nested 300 deep": (
        f"gpu_types: {nested(300)}\n",
        "gpu-cache: config: the workflow's config: config key gpu_types.0.0.0... nests deeper than 100 "
        "levels"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CONFIGFILES))
def test_a_configfile_that_expands_without_end_is_one_line_before_any_copy(case, tmp_path):
    """The block is measured before its {host: KEY} references are resolved (a copy of all it
    expands to: the dry run hung past 60 s), and again with the host's values they name."""
    text, said = CONFIGFILES[case]
    extra = tmp_path / "extra.yaml"
    extra.write_text(text)
    done = workflow_run(tmp_path, "prune: {dry_run: true}\n", "--configfile", str(extra))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1].startswith(said), done.stderr[-2000:]


# --- text that aliases repeat, nesting, values too long to quote ------------------------------------

@pytest.mark.parametrize("value, count, cap_mb", [("a string", 2000, 1024), ("a string", 8000, 2500),
                                                  ("a mapping holding it", 2000, 1024),
                                                  ("a number", 5000, 1024)])
def test_aliases_of_one_long_value_are_one_line_under_a_memory_cap(value, count, cap_mb, tmp_path):
    """2,000 aliases of one 400 KB string stayed under the bound of values; the schema check's
    message took the repr of their 800 MB (1.55 GB and 6 s), and 8,000 under a 2.5 GB cap
    ended in a MemoryError traceback. The text a config expands to is bounded too: under a
    cap of address space, one line."""
    config = tmp_path / "config.yaml"
    config.write_text(long_aliases(LONG[value], count))
    done = subprocess.run(["prlimit", f"--as={cap_mb << 20}", sys.executable, "-m", "gpu_cache", "env",
                           "--config", str(config), "--cache-root", str(tmp_path / "c")],
                          env=clean_environ(), capture_output=True, text=True, timeout=120)
    line = one_line(done, 2)
    assert line == (f"gpu-cache: error: config file {config} expands to more than 16777216 characters "
                    "of text: YAML aliases that repeat a long value; write the values out"), line


def test_a_block_that_expands_past_a_configs_text_is_one_line_though_its_file_is_not(tmp_path):
    """gpu-cache's block of a host's file is bounded as gpu-cache's own config (1 MiB of text),
    the whole file at 16 MiB: five aliases of a 400 KB string in the block (2 MB)."""
    config = tmp_path / "config.yaml"
    config.write_text(f"prediction_container: x\ngpu_cache:\n  {long_aliases(LONG['a string'], 5)}"
                      .replace("\ngpu_types:", "\n  gpu_types:"))
    line = one_line(run_cli("env", "--config", str(config), "--cache-root", str(tmp_path / "c")), 2)
    assert line == (f"gpu-cache: error: config file {config} (config key gpu_cache) expands to more than "
                    "1048576 characters of text: YAML aliases that repeat a long value; write the values out")


def test_a_configs_values_and_text_are_counted_to_the_bound():
    """Each mapping and list counts itself, each of its keys and each value (an alias each time
    it is reached); text counts the keys' and the values' characters, at every depth."""
    shared = {"ab": ["xyz", 12]}  # 1 + 1 key + (1 + 2 values) = 5 values; 2 + 3 + 2 = 7 characters
    config = {"one": shared, "two": [shared, {"c": shared}]}
    values = 1 + 2 + 5 + (1 + 5 + (1 + 1 + 5))  # 21
    text = len("one") + len("two") + 7 + 7 + (1 + 7)  # 28
    expansion.measure(config, "c", budget=values, text_budget=text)
    with pytest.raises(UsageError, match="expands to more than 20 values"):
        expansion.measure(config, "c", budget=values - 1, text_budget=text)
    with pytest.raises(UsageError, match="expands to more than 27 characters"):
        expansion.measure(config, "c", budget=values, text_budget=text - 1)


@pytest.mark.parametrize("depth, shown", [(6, "c: config key k.k.k.k.k.k contains itself"),
                                          (7, "c: config key k.k.k.k... contains itself")])
def test_a_key_path_past_six_levels_is_cut(depth, shown):
    inner: dict = {}
    config = inner
    for _ in range(depth - 1):
        config = {"k": config}
    inner["k"] = config  # the innermost mapping holds the outermost: a loop at ``depth`` keys
    with pytest.raises(UsageError, match=shown.replace(".", r"\.")):
        expansion.measure(config, "c")


def nested_json(depth: int) -> str:
    return json.dumps({"gpu_types": json.loads(nested(depth))}) if depth < 500 else \
        '{"gpu_types": ' + nested(depth) + "}"


@pytest.mark.parametrize("depth, said", ids=["990 levels", "200 levels"], argvalues=[
    (990, "gpu-cache: error: --config-json nests deeper than JSON can be read"),
    (200, "gpu-cache: error: the config: config key gpu_types.0.0.0... nests deeper than 100 levels"),
])
def test_config_json_nested_deep_is_one_line(depth, said, tmp_path):
    """990 levels were a RecursionError traceback from the JSON decoder; 200 pass it and
    the schema check, and would recurse in every walk after them."""
    done = run_cli("env", "--config-json", nested_json(depth), "--cache-root", str(tmp_path / "c"))
    assert one_line(done, 2).startswith(said)


def test_a_config_file_nested_deep_is_one_line(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(f"gpu_types: {{a100: {{resources: {{x: {nested(200)}}}}}}}\n")
    line = one_line(run_cli("env", "--config", str(config), "--cache-root", str(tmp_path / "c")), 2)
    assert line == (f"gpu-cache: error: config file {config}: config key gpu_types.a100.resources.x... "
                    "nests deeper than 100 levels of mappings and lists; a config has a few"), line


@pytest.mark.parametrize("content, said", ids=["a long string", "a long size", "a long number",
                                             "a date", "5000 digits"], argvalues=[
    (f"triton_targets: {'x' * 300_000}\n",
     "config key triton_targets: 'xxxxxxxx"),
    (f"prune: {{max_size: {'9' * 400}G}}\n", "config key prune.max_size: size '999"),
    (f"gpu_types: {{a100: {{resources: {{mem_mb: {'9' * 401}}}}}}}\n",
     "config key gpu_types.a100.resources.mem_mb: a whole number of 401 digits is greater than "
     "the maximum of 1073741824"),
    ("cache_root: 2024-13-01\n", "holds a value YAML cannot read: month must be in 1..12"),
    (f"a: {'1' * 5000}\n", "holds a value YAML cannot read: Exceeds the limit (4300 digits) for integer "
                           "string conversion: value has 5000 digits"),
])
def test_a_long_value_is_quoted_cut_with_its_length(content, said, tmp_path):
    """A message quotes at most a short cut of a value, and says how long it was (the schema's
    message quoted 300 characters of it and stopped, without its end); a value YAML's own
    constructors refuse is one line too (a traceback before)."""
    config = tmp_path / "config.yaml"
    config.write_text(content)
    line = one_line(run_cli("env", "--config", str(config), "--cache-root", str(tmp_path / "c")), 2)
    assert said in line and len(line) < 400, line
    if "x" * 300 in content:
        assert line.endswith("x' (300000 characters) is not of type 'array'"), line


@pytest.mark.slow
@pytest.mark.parametrize("depth", [300, 990])
def test_snakemakes_config_nested_deep_is_one_line(depth, tmp_path):
    """Snakemake reads ``--config KEY=VALUE`` as YAML where it can (300 levels: lists), else as
    text (990: deeper than its YAML reads); either is one line."""
    done = workflow_run(tmp_path, "prune: {dry_run: true}\n", "--config", f"gpu_types={nested(depth)}")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("gpu-cache: config:") and len(last) < 400, last
    assert ("nests deeper than 100 levels" if depth == 300 else "(1980 characters) is not of type 'object'") \
        in last, last


# --- what the user wrote is printed escaped, on one line ------------------------------------------

@pytest.mark.parametrize("case", ["a {host: KEY} name", "an unknown key", "--config-key"])
def test_what_the_user_wrote_is_printed_escaped_on_one_line(case, tmp_path):
    config = tmp_path / "config.yaml"
    extra: list[str] = []
    if case == "a {host: KEY} name":
        config.write_text(f"gpu_cache:\n  gpu_types: {{a100: {{container: {{host: {QUOTED}}}}}}}\n")
        said = f"{{host: {ESCAPED}}}: the host's config has no key {ESCAPED}"
    elif case == "an unknown key":
        config.write_text(f"gpu_cache:\n  {QUOTED}: 1\n")
        said = f"config key gpu_cache.{ESCAPED}: not a key of gpu-cache's config"
    else:
        config.write_text("gpu_cache: {}\n")
        extra = ["--config-key", HOSTILE]
        said = f"has no {ESCAPED}: block of gpu-cache's keys"
    line = one_line(run_cli("env", "--config", str(config), *extra, "--cache-root", str(tmp_path / "c")), 2)
    assert said in line, line


@pytest.mark.slow
def test_a_host_reference_in_the_workflow_is_printed_escaped_on_one_line(tmp_path):
    config = f"gpu_cache:\n  gpu_types: {{a100: {{container: {{host: {QUOTED}}}}}}}\n"
    line = one_line(workflow_run(tmp_path, config), 1)
    assert line == (f"gpu-cache: config: config key gpu_cache.gpu_types.a100.container: {{host: {ESCAPED}}}: "
                    f"the host's config has no key {ESCAPED}"), line


@pytest.mark.parametrize("command", ["warm", "validate"])
def test_warm_and_validates_progress_lines_escape_a_shape_from_the_config(command, tmp_path):
    """A shape is the user's text: the announcement, each run's progress lines and the command
    line it prints hold it escaped, each on its one line."""
    config = tmp_path / "config.yaml"
    config.write_text(f"default_workloads: [odd]\nvalidate: {{measure_cold: false}}\n"
                      f"workloads: {{odd: {{command: 'true {{shape}}', shapes: [{QUOTED}]}}}}\n")
    done = run_cli(command, "--config", str(config), "--cache-root", str(tmp_path / "c"),
                   "--output", str(tmp_path / "out.json"), timeout=120)
    assert done.returncode in (0, 1), done.stderr
    assert not [c for c in done.stderr if not c.isprintable() and c != "\n"], repr(done.stderr)
    progress = (f"gpu-cache {command}:", f"gpu-cache: {command} [cpu]", "$ ")
    shown = [line for line in done.stderr.splitlines() if ESCAPED in line]
    assert len(shown) == 4 and all(line.startswith(progress) for line in shown), shown  # announced,
    # started, its command line, ended
