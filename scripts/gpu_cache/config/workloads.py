"""Workloads: what warm and validate run, once per shape, each in a fresh process."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from gpu_cache.config.memory import MAX_TOKENS, run_memory_mb, tokens
from gpu_cache.config.settings import Settings, WorkloadConfig
from gpu_cache.config.targets import gpu_types
from gpu_cache.config.units import parse_age
from gpu_cache.core import names
from gpu_cache.core.errors import UsageError
from gpu_cache.core.runner import Command, Plan
from gpu_cache.core.shown import excerpt


@dataclass(frozen=True)
class Builtin:
    """A workload gpu-cache ships: its module (run as ``python -m <module> --shape S``), its
    default shapes, what it is, and the kinds it compiles for. One object each in
    :data:`BUILTINS`; what one does beyond that (its own arguments, a note for the verdict) is
    its own methods, never a test of its name."""

    name: str
    module: str
    shapes: tuple[Any, ...]
    about: str
    expects: tuple[str, ...]

    def options(self, entry: WorkloadConfig | None, shapes: tuple[Any, ...]) -> str:
        """Its own arguments after ``--shape``, from its config ``entry`` (none by default)."""
        return ""

    def note(self, entry: WorkloadConfig | None) -> str | None:
        """What the verdict says about its runs (None: nothing)."""
        return None

    def check_shapes(self, shapes: tuple[Any, ...]) -> None:
        """Raises: UsageError: a shape it cannot run (any, by default)."""


def _template(words: list[str]) -> str:
    """``words`` quoted for a shell, with braces doubled (the command is a template)."""
    return " " + " ".join(shlex.quote(w) for w in words).replace("{", "{{").replace("}", "}}")


class _TorchCompile(Builtin):
    def options(self, entry: WorkloadConfig | None, shapes: tuple[Any, ...]) -> str:
        """``args``: the model's sizes."""
        return _template(list(entry.args)) if entry is not None and entry.args else ""


class _AlphaFold3(Builtin):
    def check_shapes(self, shapes: tuple[Any, ...]) -> None:
        """Raises: UsageError: a bucket that is not a whole number of tokens in range."""
        for shape in shapes:
            if tokens(shape) is None:
                raise UsageError(f"config key workloads.{self.name}.shapes: {excerpt(shape)} is no bucket: "
                                 f"a bucket is a whole number of tokens from 1 to {MAX_TOKENS}")

    def options(self, entry: WorkloadConfig | None, shapes: tuple[Any, ...]) -> str:
        """Every bucket, the weights, the script, and ``args`` for run_alphafold.py."""
        words = ["--buckets", ",".join(str(s) for s in shapes)]
        if entry is not None:
            words += ["--model-dir", entry.model_dir] if entry.model_dir else []
            words += ["--script", entry.script] if entry.script else []
            words += ["--", *entry.args] if entry.args else []
        return _template(words)

    def note(self, entry: WorkloadConfig | None) -> str | None:
        if entry is None or not entry.model_dir:
            return ("alphafold3: no weights were used: each run's image wrote random parameters of the "
                    "shapes its AlphaFold 3 expects into a private temporary folder and deleted them "
                    "after the run (workloads.alphafold3.model_dir gives real ones)")
        return None


#: The built-in workloads, by name.
BUILTINS: dict[str, Builtin] = {workload.name: workload for workload in (
    Builtin("jax-transformer", "gpu_cache.workloads.jax_transformer", (32, 64, 128),
            "4 pre-norm transformer layers, value_and_grad, per sequence length", ("jax",)),
    # 1000 and 4096 specialise differently (divisibility by 16): 10 distinct kernels.
    Builtin("triton-kernels", "gpu_cache.workloads.triton_kernels", (1000, 4096),
            "vector add, row softmax, tiled matmul x3; ahead of time for triton_targets without a GPU",
            ("triton",)),
    _TorchCompile("torch-compile", "gpu_cache.workloads.torch_compile", (32, 64),
                  "4 pre-norm transformer blocks under torch.compile (Inductor), forward and backward, "
                  "per sequence length", ("inductor",)),
    # sequence lengths (multiples of 128): the kernels are specialised on them.
    Builtin("jax-triton", "gpu_cache.workloads.jax_triton_kernels", (256, 512),
            "an attention block of jax-triton kernels (5 tiled matmuls, flash attention); run on a "
            "GPU, lowered for triton_targets without one", ("jax_triton",)),
    # AlphaFold 3's default buckets up to 1024 tokens; give the jobs' own (--buckets).
    _AlphaFold3("alphafold3", "gpu_cache.workloads.alphafold3", (256, 512, 768, 1024),
                "the image's run_alphafold.py, data pipeline off, one poly-glycine chain per token "
                "bucket, on model_dir's weights or, without it, on random ones", ("jax",)),
)}


@dataclass(frozen=True)
class Workload:
    """A command template run once per shape; ``builtin`` when gpu-cache ships it;
    ``outputs``: the file a user's command writes its outputs to (issue 40)."""

    name: str
    command: str
    shapes: tuple[Any, ...]
    timeout_seconds: float
    builtin: bool
    expects: tuple[str, ...] = ()
    #: What the verdict says about this workload's runs (None: nothing).
    note: str | None = None
    outputs: str | None = None

    @property
    def reports_outputs(self) -> bool:
        """Whether its runs report outputs: a built-in's own, a user's ``outputs`` file."""
        return self.builtin or self.outputs is not None

    def commands(self, python: str, gpu_type: str) -> list[tuple[Any, str]]:
        """``(shape, shell command)`` for each shape.

        Raises:
            UsageError: the template names a placeholder other than shape, python, gpu_type.
        """
        out = []
        for shape in self.shapes:
            values = {"shape": shlex.quote(str(shape)), "python": shlex.quote(python),
                      "gpu_type": shlex.quote(gpu_type)}
            try:
                out.append((shape, self.command.format_map(values)))
            except (KeyError, IndexError, ValueError) as exc:
                raise UsageError(
                    f"workload {self.name}: command template {excerpt(self.command)} is not valid "
                    f"({excerpt(exc)}); it may use {{shape}}, {{python}} and {{gpu_type}}; "
                    "write {{ and }} for literal braces"
                ) from None
        return out


def resolve_workload(settings: Settings, name: str) -> Workload:
    """The workload called ``name``: a user entry in config, or a built-in.

    Raises:
        UsageError: the name is neither a built-in nor configured with a command.
    """
    entry = settings.workloads.get(name)
    timeout = entry.timeout_seconds if entry else parse_age("2h")
    if entry is not None and entry.command is not None:
        shapes = entry.shapes
        if not shapes:
            if "{shape}" in entry.command:
                raise UsageError(f"workload {name}: its command uses {{shape}}, so give it shapes")
            shapes = ("-",)
        if entry.outputs is not None:
            _check_outputs(name, entry.outputs)
        return Workload(name, entry.command, shapes, timeout, builtin=False, expects=entry.expects,
                        outputs=entry.outputs)
    builtin = BUILTINS.get(name)
    if builtin is not None:
        shapes = (entry.shapes if entry else ()) or builtin.shapes
        builtin.check_shapes(shapes)
        command = f"{{python}} -m {builtin.module} --shape {{shape}}" + builtin.options(entry, shapes)
        return Workload(name, command, shapes, timeout, builtin=True,
                        expects=(entry.expects if entry else ()) or builtin.expects, note=builtin.note(entry))
    known = ", ".join(sorted(set(BUILTINS) | set(settings.workloads)))
    raise UsageError(
        f"unknown workload {excerpt(name)}; known workloads: {known}. A workload of your own needs "
        f"workloads.{name}.command in the config"
    )


def _check_outputs(name: str, template: str) -> None:
    """Raises: UsageError: a workload's ``outputs`` names a placeholder other than {shape} and
    {gpu_type} (issue 40)."""
    try:
        template.format_map({"shape": "", "gpu_type": ""})
    except (KeyError, IndexError, ValueError) as exc:
        raise UsageError(f"workload {name}: outputs {excerpt(template)} is not valid ({excerpt(exc)}); it "
                         "may use {shape} and {gpu_type}; write {{ and }} for literal braces") from None


def workloads_of(settings: Settings, gpu_type: str) -> list[Workload]:
    """The resolved workloads of one GPU type.

    Raises:
        UsageError: the type is not configured, or names an unknown workload.
    """
    types = gpu_types(settings)
    if gpu_type not in types:
        raise UsageError(f"unknown GPU type {excerpt(gpu_type)}; configured types: {', '.join(types)}")
    return [resolve_workload(settings, name) for name in types[gpu_type].workload_names]


def plan_phase(settings: Settings, gpu_type: str, phase: str, record: bool = True,
               in_job_software: bool = False) -> Plan:
    """The plan of one pass (``phase``: warm, cold, validate) over ``gpu_type``'s workloads,
    for :func:`gpu_cache.core.runner.run_plan`. ``in_job_software``: the runner runs in the type's
    container or conda environment, whose own interpreter is then ``{python}``; else the
    type's ``python``.

    Raises:
        UsageError: the GPU type or one of its workloads is unknown, or a command template
            names a placeholder other than shape, python and gpu_type.
    """
    commands = []
    for workload in workloads_of(settings, gpu_type):
        workload.commands(settings.python or "python3", gpu_type)  # checks the template
        commands += [Command(workload.name, shape, workload.command, workload.timeout_seconds,
                             workload.builtin, workload.expects, workload.outputs,
                             run_memory_mb(workload.name, workload.builtin, shape))
                     for shape in workload.shapes]
    environ = {names.GPU_TYPE_VAR: gpu_type, names.RULE_VAR: names.own_rule(phase),
               names.TRITON_TARGETS_VAR: ",".join(settings.triton_targets)}
    if phase == "warm":  # the hook keeps what tokamax tunes in these processes (issue 24)
        environ[names.AUTOTUNE_SAVE_VAR] = "1"
    python = None if in_job_software else gpu_types(settings)[gpu_type].python or settings.python
    # Warm runs its shapes side by side (0: as many as the job's threads, which the runner is
    # told); validation runs them one after another, as the jobs start them.
    parallel = (settings.warm.parallel or 0) if phase == "warm" else 1
    # The cold pass is measured again each time only with measure_cold: always.
    reuse = settings.warm.skip_when_valid if phase == "warm" else settings.validate.measure_cold != "always"
    # The warm pass keeps the writers' outputs (the proof's references), the validate pass
    # compares with them, the cold pass keeps a fresh compile's for a figure (issue 47).
    return Plan(phase, gpu_type, tuple(commands), environ, record, python, parallel, reuse,
                gpu_types(settings)[gpu_type].container, outputs=settings.validate.outputs != "off")


def cold_pass(settings: Settings, gpu_type: str) -> bool:
    """Whether validation runs the cold pass (every cache off): for its time
    (``validate.measure_cold``); its outputs are the outputs proof's fresh-compile figure."""
    return bool(settings.validate.measure_cold)
