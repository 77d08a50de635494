"""One process of AlphaFold 3's real network for tests/benchmarks/alphafold3_gpu.py (issue 39):
ColabFold's wheel (``alphafold3-colabfold``), a poly-glycine chain that fills ``--bucket``, random
parameters of the real shapes (``gpu_cache.workloads.alphafold3_weights.shapes``), the network
jitted as ``run_alphafold.py`` jits it, and where the time goes, printed as one JSON line:

``import`` (jax, haiku, tokamax, AlphaFold 3), ``parameters`` (their shapes and random values on
the device), ``featurise``, ``trace``, ``lower``, ``compile`` (XLA, or JAX's cache), ``first_call``
(ptxas of jax-triton kernels and their first launch included) and ``second_call`` (the steady
state); ``jax_triton`` (seconds inside jax-triton's kernel compile step, hit or miss: part of
``lower``), ``ptxas`` (seconds of the ptxas calls that went through ``PATH``, when the benchmark
put its timing wrapper there), ``tokamax_autotune`` (seconds tokamax spent autotuning) and
``tokamax_misses`` (its autotuning-cache misses, from its log); ``peak_rss_mb``: the process's
peak resident memory (``VmHWM``) at the end of each phase, for tests/benchmarks/alphafold3_memory.py.
``--stop-after PHASE`` ends the process after that phase (``compile``: what the host needs on a GPU,
where the network's activations are on the device; on a CPU they are host memory).

For the benchmark's split of each process's wall time: ``started_at`` and ``ended_at`` (epoch
seconds of the driver's first line and of the result line; ``BENCH_SPAWNED_AT``, set by the
benchmark, says when the process was started) and ``cache_work``, per phase, the seconds of
JAX's compile steps inside it (its ``backend_compile_duration`` events: the cache key, read,
any single-flight wait, the compile and the write), which the record of the process splits
into waiting, compiling and loading.

``--glu xla`` runs tokamax's XLA GLU instead of its Triton GLU (no jax-triton); ``--glu triton``
(the default kernels) sets ``triton.backends.nvidia.driver.TMA_TF32`` first where the installed
Triton lacks it (jax-triton 0.4.1 imports it with its NVIDIA backend, and Triton 3.6.0 has no such
name). ``--attention xla`` for a CPU. Runs on Python 3.12 with the wheel, jax, dm-haiku, tokamax.
"""

import argparse
import functools
import json
import logging
import os
import sys
import time

STARTED_AT = time.time()


def _parse(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--bucket", type=int, default=256)
    parser.add_argument("--recycles", type=int, default=10)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--steps", type=int, default=None, help="diffusion steps (default: the model's 200)")
    parser.add_argument("--attention", default="triton", help="flash_attention_implementation")
    parser.add_argument("--glu", choices=("triton", "xla"), default="triton")
    parser.add_argument("--stop-after", choices=PHASES, default=PHASES[-1])
    return parser.parse_args(argv)


#: The phases, in order (``--stop-after`` ends after one of them).
PHASES = ("import", "parameters", "featurise", "trace", "lower", "compile", "first_call", "second_call")


def _peak_rss_mb():
    """This process's peak resident memory so far (Linux's ``VmHWM``), in MB; None elsewhere."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024)
    except OSError:
        pass
    return None


class _Misses(logging.Filter):
    def __init__(self):
        super().__init__()
        self.count = 0

    def filter(self, record):
        if isinstance(record.msg, str) and record.msg.startswith("Autotuning cache miss"):
            self.count += 1
        return True


def _timed(owner, name, seconds):
    """Wrap ``owner.name`` so that its calls add their seconds to ``seconds[0]``."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            seconds[0] += time.perf_counter() - started

    setattr(owner, name, wrapper)


def _ptxas_seconds():
    """The seconds of the ptxas calls the benchmark's wrapper logged (``start end`` lines)."""
    log = os.environ.get("AF3_BENCH_PTXAS_LOG")
    if not log or not os.path.exists(log):
        return None
    with open(log) as lines:
        pairs = [line.split() for line in lines if len(line.split()) == 2]
    return round(sum(float(end) - float(start) for start, end in pairs), 3)


def main(argv=None):
    args = _parse(sys.argv[1:] if argv is None else argv)
    out, clock = {"started_at": STARTED_AT, "peak_rss_mb": {}}, time.perf_counter()
    compiling, work = [0.0], {}

    class _Stop(Exception):
        pass

    def lap(name):
        nonlocal clock
        now = time.perf_counter()
        out[name] = round(now - clock, 3)
        out["peak_rss_mb"][name] = _peak_rss_mb()
        clock = now
        work[name], compiling[0] = round(compiling[0], 3), 0.0
        if name == args.stop_after:
            raise _Stop

    try:
        _phases(args, lap, out, compiling)
    except _Stop:
        pass
    out.update(cache_work=work, pid=os.getpid())
    out["ended_at"] = time.time()
    print(json.dumps(out), flush=True)
    return 0


def _phases(args, lap, out, compiling):
    """Run the phases, calling ``lap`` at the end of each; ``compiling``: JAX's compile seconds
    since the last lap."""
    if args.glu == "triton":
        import triton.backends.nvidia.driver as driver

        driver.TMA_TF32 = getattr(driver, "TMA_TF32", 0)
    import jax
    from jax import monitoring

    def on_duration(event, duration_secs, **_kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiling[0] += duration_secs

    monitoring.register_event_duration_secs_listener(on_duration)
    import haiku as hk
    import numpy as np
    import tokamax
    from absl import logging as absl_logging
    from alphafold3.common import folding_input
    from alphafold3.constants import chemical_components
    from alphafold3.data import featurisation
    from alphafold3.model import config_factory, model
    from alphafold3.model.components import platform, utils

    from gpu_cache.workloads import alphafold3, alphafold3_weights

    misses = _Misses()
    absl_logging.get_absl_logger().addFilter(misses)
    jt_seconds, tune_seconds = [0.0], [0.0]
    if args.glu == "xla":
        tokamax.gated_linear_unit = functools.partial(tokamax.gated_linear_unit, implementation="xla")
    else:
        import jax_triton.triton_lib as triton_lib

        _timed(triton_lib.TritonFunction, "get_or_create_kernel", jt_seconds)
    _timed(tokamax.BoundArguments, "autotune", tune_seconds)
    platform.preinit_tokamax_context()
    out["device"] = jax.devices()[0].device_kind
    lap("import")

    shapes = alphafold3_weights.shapes()
    largest = max(int(np.prod(s.shape)) for arrays in shapes.values() for s in arrays.values())
    pool = np.random.default_rng(int(os.environ.get("AF3_BENCH_SEED", "0"))).standard_normal(
        largest, dtype=np.float32) * 0.02

    def random(spec):  # slices of one draw, as the workload's weights writer makes them
        return jax.device_put(pool[:int(np.prod(spec.shape))].reshape(spec.shape).astype(spec.dtype))

    params = {scope: {name: random(s) for name, s in arrays.items()} for scope, arrays in shapes.items()}
    jax.block_until_ready(params)
    lap("parameters")

    config = config_factory.make_model_config(
        flash_attention_implementation=args.attention, num_diffusion_samples=args.samples,
        num_recycles=args.recycles, num_sampling_steps=args.steps)
    fold = folding_input.Input.from_json(json.dumps(alphafold3.fold_input(args.bucket)))
    (batch,) = featurisation.featurise_input(fold, chemical_components.Ccd(), [args.bucket])
    batch = utils.remove_invalidly_typed_feats(batch)
    batch = jax.device_put(jax.tree_util.tree_map(jax.numpy.asarray, batch))
    key = jax.random.PRNGKey(1)
    jax.block_until_ready((batch, key))
    lap("featurise")

    step = jax.jit(hk.transform(lambda b: model.Model(config)(b)).apply)
    traced = step.trace(params, key, batch)
    lap("trace")
    lowered = traced.lower()
    lap("lower")
    compiled = lowered.compile()
    lap("compile")
    jax.block_until_ready(compiled(params, key, batch))
    lap("first_call")
    jax.block_until_ready(compiled(params, key, batch))
    lap("second_call")
    out.update(jax_triton=round(jt_seconds[0], 3), tokamax_autotune=round(tune_seconds[0], 3),
               tokamax_misses=misses.count, ptxas=_ptxas_seconds())


if __name__ == "__main__":
    sys.exit(main())
