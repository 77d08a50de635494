"""Configuration: the JSON schema, its defaults, and the cache root.

One schema (``workflow/schemas/config.schema.yaml``) serves the workflow (through
Snakemake's ``validate``) and the CLI (here), so both accept exactly the same keys.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_cache.config import expansion
from gpu_cache.config.units import parse_age, parse_size
from gpu_cache.core import names, owners, safe_io
from gpu_cache.core.errors import UsageError
from gpu_cache.core.shown import clipped, excerpt

SCHEMA_PATH = Path(__file__).with_name("config.schema.yaml")
#: Values of a cache root that turn caching off.
#: A config file larger than this is not a config.
MAX_CONFIG_BYTES = 1 << 20
OFF_WORDS = frozenset({"", "none", "off", "false", "no", "0"})


#: What :func:`validate_config` returns for a config that sets nothing (the profile's, and
#: ``gpu-cache env`` without ``--config``): every key at its schema default. Such a config
#: skips the schema check and the YAML parse (about 100 ms of jsonschema and yaml imports,
#: paid at every Snakemake start). A key added to the schema needs its default here too:
#: tests/test_scale.py fails until it matches the schema.
DEFAULT_CONFIG: dict[str, Any] = {
    "cache_root": None,
    "xla_caches": "none",
    "shared_group": None,
    "min_free_space": "1G",
    "stats_hook": True,
    "bytecode_cache": False,
    "ptxas_cache": True,
    "single_flight": {"enabled": True, "timeout": "10m"},
    "python": None,
    "triton_targets": ["sm_90"],
    "default_workloads": ["jax-transformer"],
    "workloads": {},
    "gpu_types": {},
    "host_rules": [],
    "warm": {"parallel": None, "skip_when_valid": True},
    "validate": {"measure_cold": True, "strict": False, "outputs": "identical", "outputs_tolerance": 0.01},
    "prune": {"max_size": "10G", "max_age": "30d", "dry_run": False},
    "local_tier": {"mode": "auto", "folder": "", "max_size": "20G"},
    "registry": {"fetch": None, "publish": None},
}


def load_schema() -> dict[str, Any]:
    """The config schema as a dict."""
    import yaml  # deferred: a config that sets nothing needs neither the schema nor yaml

    with SCHEMA_PATH.open() as stream:
        return yaml.safe_load(stream)


def fill_defaults(schema: Mapping[str, Any], value: Any) -> Any:
    """Return ``value`` with each missing key that the schema gives a default filled in."""
    if not isinstance(value, dict) or schema.get("type") != "object":
        return value
    filled = dict(value)
    for key, sub in schema.get("properties", {}).items():
        if key not in filled and "default" in sub:
            filled[key] = copy.deepcopy(sub["default"])
        if key in filled:
            filled[key] = fill_defaults(sub, filled[key])
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        for key in filled:
            if key not in schema.get("properties", {}):
                filled[key] = fill_defaults(extra, filled[key])
    return filled


def named_as_text(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with GPU type names and GPU models that YAML read as numbers (``3090:``,
    ``gpu_model: 3090``, as SLURM names the GPU) as the text they are, and a list of SLURM
    partitions (a host's ``slurm_partition: [a, b]``, given by an anchor) as ``a,b``."""
    config = dict(config)
    types = config.get("gpu_types")
    if not isinstance(types, Mapping):
        return config
    config["gpu_types"] = {str(name) if isinstance(name, int) else name: spec for name, spec in types.items()}
    for name, spec in config["gpu_types"].items():
        resources = spec.get("resources") if isinstance(spec, Mapping) else None
        if not isinstance(resources, Mapping):
            continue
        resources = dict(resources)
        model, partition = resources.get("gpu_model"), resources.get("slurm_partition")
        if isinstance(model, int) and not isinstance(model, bool):
            resources["gpu_model"] = str(model)
        if isinstance(partition, list) and all(isinstance(p, str) for p in partition):
            resources["slurm_partition"] = ",".join(partition)
        config["gpu_types"][name] = {**spec, "resources": resources}
    return config


def validate_config(config: Mapping[str, Any] | None, where: str = "") -> dict[str, Any]:
    """Check ``config`` against the schema and return it with defaults filled in; ``where``: the
    key that holds it in a host's config (``gpu_cache``), which begins each key a message names.

    Raises:
        UsageError: a key is unknown or a value has the wrong type; the message names the key.
    """
    if config is not None and not isinstance(config, Mapping):
        raise UsageError(f"the config must be a mapping of keys, not {type(config).__name__}")
    if not config:
        return copy.deepcopy(DEFAULT_CONFIG)  # the schema's defaults, checked by a test

    expansion.measure(config, "the config")  # before anything walks it: the schema check would hang
    config = named_as_text(config)
    schema = load_schema()
    validator = _validator_class()(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        raise UsageError(_error_line(errors[0], where))
    filled = fill_defaults(schema, config)
    # Values the schema cannot check: sizes and ages must parse.
    checks = [("prune.max_size", parse_size, filled["prune"]["max_size"]),
              ("local_tier.max_size", parse_size, filled["local_tier"]["max_size"]),
              ("min_free_space", parse_size, filled["min_free_space"]),
              ("prune.max_age", parse_age, filled["prune"]["max_age"]),
              ("single_flight.timeout", parse_age, filled["single_flight"]["timeout"])]
    checks += [(f"workloads.{name}.timeout", parse_age, workload["timeout"])
               for name, workload in filled["workloads"].items()]
    checks += [(f"gpu_types.{name}.queue_wait", parse_age, spec["queue_wait"])
               for name, spec in filled["gpu_types"].items()]
    for key, parse, value in checks:
        try:
            parse(value)
        except UsageError as exc:
            raise UsageError(f"config key {'.'.join(filter(None, [where, key]))}: {exc}") from None
    return filled


def _error_line(error: Any, where: str = "") -> str:
    """One line for a schema error, naming the key (its path from ``where``); an unknown key (a
    typo) by its own path, with the known key nearest to it. (Snakemake's own check printed the
    whole schema.)"""
    path = [*([where] if where else []), *(str(part) for part in error.absolute_path)]
    known = list(error.schema.get("properties", {})) if isinstance(error.schema, dict) else []
    if error.validator == "additionalProperties" and isinstance(error.instance, dict) and known:
        unknown = next(str(key) for key in error.instance if key not in known)
        import difflib

        near = difflib.get_close_matches(unknown, known, 1)
        hint = f"; did you mean {near[0]}?" if near else ""
        return (f"config key {clipped('.'.join([*path, unknown]), 200)}: not a key of gpu-cache's "
                f"config{hint} (config/README.md explains each)")
    where = clipped(".".join(path), 200) or "(top level)"
    return f"config key {where}: {_message(error)}"


def _message(error: Any) -> str:
    """jsonschema's message with the value it quotes cut (:func:`excerpt`): it opens with the
    value's ``repr``, whole (the config is bounded before: :mod:`expansion`)."""
    message, quoted = error.message, repr(error.instance)
    if message.startswith(quoted):
        message = excerpt(error.instance) + message[len(quoted):]
    return message if len(message) <= 300 else f"{message[:300]} ... ({len(message)} characters)"


def _validator_class() -> Any:
    """The schema's validator, with each ``pattern`` matched against the whole value.

    jsonschema matches a pattern with ``re.search``, where ``$`` also matches before a final
    newline: "a100" with a newline after it would pass ``^[A-Za-z0-9_.-]+$`` and become a GPU
    type, a wildcard value and a file name with a newline in it (ECMA-262 has no end-of-text
    anchor to write instead).
    """
    import re

    import jsonschema

    def whole_pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
        if validator.is_type(instance, "string") and re.fullmatch(pattern, instance) is None:
            yield jsonschema.ValidationError(f"{excerpt(instance)} does not match {pattern!r}")

    return jsonschema.validators.extend(jsonschema.Draft202012Validator, {"pattern": whole_pattern})


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The mapping a YAML or JSON config file holds (a symbolic link to one is followed), not
    yet validated: gpu-cache's own config or a host pipeline's (``gpu_cache.config.host``).

    Raises:
        UsageError: the file is not a regular file (a FIFO would block the open forever, #21),
            cannot be read, is not UTF-8 YAML, is not a mapping, or is unreasonably large.
    """
    try:
        raw = safe_io.read_bounded(os.path.realpath(path), MAX_CONFIG_BYTES)
    except safe_io.NotRegularFile as exc:
        raise UsageError(f"config file {path} is {exc.what}, not a regular file") from None
    except safe_io.TooLarge:
        raise UsageError(f"config file {path} is larger than {MAX_CONFIG_BYTES} bytes; is it the "
                         "right file?") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise UsageError(f"cannot read config file {path}: {reason}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"config file {path} is not UTF-8 text (byte {exc.start})") from None
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UsageError(f"config file {path} is not valid YAML: {_yaml_error(exc, text)}") from None
    except RecursionError:  # PyYAML's composer recurses once per level
        raise UsageError(f"config file {path} nests deeper than YAML can be read") from None
    except ValueError as exc:  # a value its constructors refuse: a date 2024-13-01, 5,000 digits
        said = str(exc).split(": use sys.")[0].split("; use sys.")[0]
        raise UsageError(f"config file {path} holds a value YAML cannot read: {clipped(said, 120)}") from None
    if data is not None and not isinstance(data, dict):
        raise UsageError(f"config file {path} must hold a mapping of keys, not {type(data).__name__}")
    # Aliases load shared: a few bytes may expand to billions of values (or contain themselves)
    # in the merge and the checks after this.
    expansion.measure(data, f"config file {path}", budget=expansion.MAX_FILE_NODES,
                      text_budget=expansion.MAX_FILE_TEXT)
    return data


def _yaml_error(exc: Exception, text: str) -> str:
    """A YAML parser's error in one line: ``line L, column C: what (while what)``; the parser's
    own message takes 4-5 lines with a copy of the offending line."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is None and isinstance(getattr(exc, "position", None), int):  # yaml.ReaderError
        line = text.count("\n", 0, exc.position)
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1)
        character = f"#x{exc.character:04x}" if isinstance(exc.character, int) else repr(exc.character)
        return f"line {line + 1}, column {column + 1}: unacceptable character {character}: {exc.reason}"
    if mark is None or not problem:
        return " ".join(str(exc).split())
    context = getattr(exc, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(f"{where}: {problem}{f' ({context})' if context else ''}".split())


def resolve_cache_root(
    explicit: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Path | None:
    """The absolute cache root, or None when caching is turned off.

    ``explicit`` (from ``--cache-root`` or the config) wins; else ``$GPU_CACHE_ROOT``; else
    ``$XDG_CACHE_HOME/gpu-cache``; else ``~/.cache/gpu-cache``. A value in
    :data:`OFF_WORDS` turns caching off. ``~`` and ``~/...`` are expanded with ``$HOME``,
    ``~user/...`` to that user's home (as ``os.path.expanduser`` does), and a relative path is
    made absolute against the current directory, since each job has its own cwd.

    Raises:
        UsageError: ``~user`` names no user here.
    """
    environ = os.environ if environ is None else environ
    if explicit is None:
        explicit = environ.get(names.ROOT_VAR)
    if explicit is None:
        xdg = environ.get("XDG_CACHE_HOME")
        base = Path(xdg) if xdg else Path(environ.get("HOME") or Path.home()) / ".cache"
        explicit = str(base / "gpu-cache")
    if explicit.strip().lower() in OFF_WORDS:
        return None
    home = environ.get("HOME")
    if (explicit == "~" or explicit.startswith("~/")) and home:
        explicit = home + explicit[1:]
    elif explicit.startswith("~"):  # ~user/...: that user's home, as the shell has it
        expanded = os.path.expanduser(explicit)
        if expanded == explicit:
            user = explicit[1:].split("/", 1)[0]
            if not user:
                raise UsageError(f"cache root {explicit}: $HOME is not set and your user has no "
                                 "home in the password database (write the absolute path)")
            raise UsageError(f"cache root {explicit}: no user {user!r} on this machine, so "
                             f"~{user} cannot be expanded (write the absolute path)")
        explicit = expanded
    return Path(os.path.abspath(explicit))


@dataclass(frozen=True)
class WorkloadConfig:
    """A workload entry of the config: a command template (None for a built-in) run once
    per shape, stopped after ``timeout_seconds``."""

    command: str | None
    shapes: tuple[Any, ...]
    timeout_seconds: float
    expects: tuple[str, ...] = ()
    #: The built-in alphafold3 workload's weights folder, run_alphafold.py and extra flags.
    model_dir: str | None = None
    script: str | None = None
    args: tuple[str, ...] = ()
    #: A user workload's outputs file (issue 40), a template of {shape} and {gpu_type}.
    outputs: str | None = None


@dataclass(frozen=True)
class GpuType:
    """One target GPU type: its name (the gpu_type wildcard), workloads, GPUs per job, resources."""

    name: str
    workload_names: tuple[str, ...]
    gpus: int = 1
    resources: dict[str, Any] = field(default_factory=dict)
    device: str | None = None
    container: str | None = None
    conda: str | None = None
    python: str | None = None
    #: The partition may lack this type: a job of it that found no node ends "unscheduled"
    #: (after ``queue_wait_seconds`` in the queue at most). None: :attr:`is_optional` decides.
    optional: bool | None = None
    queue_wait_seconds: float = 2 * 3600.0

    @property
    def expected_device(self) -> str:
        """The device type its jobs must see: ``device`` if configured, else the type's name."""
        return self.device or self.name

    @property
    def is_optional(self) -> bool:
        """``optional`` as configured; by default, whether the type asks SLURM for a place
        (a type that does not runs wherever Snakemake runs its jobs: it cannot go unscheduled).
        Optional by default (#25): a type the partition lacks must not hold back the jobs that
        wait for every type's verdict; a job that needs that type still fails on its own."""
        if self.optional is not None:
            return self.optional
        return any(self.resources.get(name) for name in PLACEMENT_RESOURCES)


#: Resources that put a job on a node of its GPU type; a job of an optional type that could
#: not run there is retried without them (it then runs no workload: "unscheduled").
PLACEMENT_RESOURCES = ("slurm_partition", "qos", "gres", "gpu", "gpu_model", "constraint", "slurm_extra")


@dataclass(frozen=True)
class ValidateConfig:
    """How validation runs and judges (config key ``validate``)."""

    measure_cold: bool | str = True  # True: once per set of inputs; "always"; False
    strict: bool = False
    outputs: str = "identical"  # the outputs proof (issues 40, 47): "identical", "tolerant", "off"
    outputs_tolerance: float = 0.01  # with "tolerant": a float array's relative difference beyond its noise


@dataclass(frozen=True)
class SingleFlightConfig:
    """Single-flight across processes (config key ``single_flight``), parsed."""

    enabled: bool = True
    timeout_seconds: float = 600.0


@dataclass(frozen=True)
class WarmConfig:
    """How the warm step runs (config key ``warm``)."""

    parallel: int | None = None
    skip_when_valid: bool = True


@dataclass(frozen=True)
class PruneConfig:
    """The prune checkpoint's limits (config key ``prune``), parsed."""

    max_size: int = 10 << 30
    max_age_seconds: float = 30 * 86400.0
    dry_run: bool = False


@dataclass(frozen=True)
class LocalTierConfig:
    """The node-local tier over the cache root (config key ``local_tier``, issue 23), parsed.

    ``mode``: "auto" (on where the cache root is on a network filesystem), "on" or "off".
    ``folder``: where each node keeps it ("" : ``/tmp/gpu-cache-<uid>/tier``; ``~`` and
    ``$VARS`` expanded), the same path on every node. ``max_size``: its bound per node."""

    mode: str = "auto"
    folder: str = ""
    max_size: int = 20 << 30


@dataclass(frozen=True)
class Settings:
    """Everything the commands need, resolved from config, flags and environment.

    Each config key has a typed field; ``config`` keeps the validated mapping itself, which
    the workflow hands to the CLI of each rule (``--config-json``).
    """

    cache_root: Path | None
    xla_caches: str = "none"
    stats_hook: bool = True
    bytecode_cache: bool = False
    ptxas_cache: bool = True
    shared_group: str | None = None
    #: ``shared_group``'s name and id, looked up once (None: a cache of one's own).
    team: owners.Team | None = None
    min_free_space: int = 1 << 30
    python: str | None = None
    triton_targets: tuple[str, ...] = ("sm_90",)
    default_workloads: tuple[str, ...] = ("jax-transformer",)
    workloads: dict[str, WorkloadConfig] = field(default_factory=dict)
    gpu_types: dict[str, GpuType] = field(default_factory=dict)
    #: A host's rules that wait for every type's verdict (gpu-cache as a module).
    host_rules: tuple[str, ...] = ()
    warm: WarmConfig = WarmConfig()
    validate: ValidateConfig = ValidateConfig()
    prune: PruneConfig = PruneConfig()
    single_flight: SingleFlightConfig = SingleFlightConfig()
    local_tier: LocalTierConfig = LocalTierConfig()
    config: dict[str, Any] = field(default_factory=dict)


def settings_from(
    config: Mapping[str, Any] | None = None,
    cache_root: str | None = None,
    environ: Mapping[str, str] | None = None,
    where: str = "",
) -> Settings:
    """Settings from a (validated or raw) config, a ``--cache-root`` flag and the environment;
    ``where``: the key that holds the config in a host's (:func:`validate_config`).

    Raises:
        UsageError: the config does not match the schema, or names a shared_group that
            does not exist here.
    """
    filled = validate_config(config, where)
    team = owners.team_named(filled["shared_group"]) if filled["shared_group"] is not None else None
    root = resolve_cache_root(cache_root if cache_root is not None else filled["cache_root"], environ)
    defaults = tuple(filled["default_workloads"])
    return Settings(
        cache_root=root,
        xla_caches=filled["xla_caches"],
        stats_hook=filled["stats_hook"],
        bytecode_cache=filled["bytecode_cache"],
        ptxas_cache=filled["ptxas_cache"],
        shared_group=filled["shared_group"],
        team=team,
        min_free_space=parse_size(filled["min_free_space"]),
        python=filled["python"],
        triton_targets=tuple(filled["triton_targets"]),
        default_workloads=defaults,
        workloads={name: WorkloadConfig(entry.get("command"), tuple(entry.get("shapes") or ()),
                                        parse_age(entry["timeout"]), tuple(entry["expects"]),
                                        entry.get("model_dir"), entry.get("script"),
                                        tuple(entry.get("args") or ()), entry.get("outputs"))
                   for name, entry in filled["workloads"].items()},
        gpu_types={name: GpuType(name, tuple(spec.get("workloads") or defaults), int(spec["gpus"]),
                                 dict(spec["resources"]), spec["device"], spec["container"],
                                 spec["conda"], spec["python"] or filled["python"],
                                 spec["optional"], parse_age(spec["queue_wait"]))
                   for name, spec in filled["gpu_types"].items()},
        host_rules=tuple(filled["host_rules"]),
        warm=WarmConfig(**filled["warm"]),
        validate=ValidateConfig(**filled["validate"]),
        prune=PruneConfig(parse_size(filled["prune"]["max_size"]),
                          parse_age(filled["prune"]["max_age"]), filled["prune"]["dry_run"]),
        single_flight=SingleFlightConfig(filled["single_flight"]["enabled"],
                                         parse_age(filled["single_flight"]["timeout"])),
        local_tier=LocalTierConfig(filled["local_tier"]["mode"], filled["local_tier"]["folder"],
                                   parse_size(filled["local_tier"]["max_size"])),
        config=filled,
    )
