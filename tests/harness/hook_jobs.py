"""Jobs with the startup hook, for the tests of the hook and its pieces: a fake ``jax`` that has
just what the hook hooks, the records a job left, its warning lines, the proof that a job runs as
without the hook; and real tokamax jobs under ``gpu-cache env`` (test_tokamax, test_autotune,
test_carry)."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from gpu_cache.config.settings import settings_from
from gpu_cache.jobenv import env
from helpers import SCRIPTS, clean_environ, unavailable


def records_of(cache_root: Path) -> list[dict]:
    folder = cache_root / "records"
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.exists() else []


#: A fake ``jax`` with just what the hook hooks: monitoring, the cache key and the cache log.
FAKE_JAX = {
    "__init__.py": "from jax import monitoring\nfrom jax._src import compiler\n"
                   "def compile_many(n, hit=False, prefix='f'):\n"
                   "    for i in range(n):\n"
                   "        compiler.compile(f'{prefix}{i}', hit)\n",
    "monitoring.py": "_events, _durations = [], []\n"
                     "def register_event_listener(f): _events.append(f)\n"
                     "def register_event_duration_secs_listener(f): _durations.append(f)\n"
                     "def record_event(name):\n"
                     "    for f in _events: f(name)\n",
    "_src/__init__.py": "",
    "_src/cache_key.py": "import hashlib\n"
                         "def _log_cache_key_hash(hash_obj, last_serialized, hashfn=None): pass\n"
                         "def get(module, devices, compile_options, backend, compression_algorithm='zlib'):\n"
                         "    h = hashlib.sha256()\n"
                         "    for part in ('computation', 'compile_options'):\n"
                         "        h.update(f'{module}/{part}'.encode())\n"
                         "        _log_cache_key_hash(h, part)\n"
                         "    return f'jit_{module}-{h.hexdigest()}'\n",
    "_src/compiler.py": "from jax import monitoring\nfrom jax._src import cache_key\n"
                        "def log_persistent_cache_hit(module_name, cache_key): pass\n"
                        "def log_persistent_cache_miss(module_name, cache_key): pass\n"
                        "def compile(name, hit):\n"
                        "    key = cache_key.get(name, [], None, None)\n"
                        "    monitoring.record_event('/jax/compilation_cache/compile_requests_use_cache')\n"
                        "    if hit:\n"
                        "        monitoring.record_event('/jax/compilation_cache/cache_hits')\n"
                        "        log_persistent_cache_hit(f'jit_{name}', key)\n"
                        "    else:\n"
                        "        log_persistent_cache_miss(f'jit_{name}', key)\n",
}


#: A job on the fake jax: compiles, prints, and exits with its own code.
FAKE_PROGRAM = "import jax; jax.compile_many(3); print('the job ran'); raise SystemExit(3)"


def fake_jax(tmp_path: Path, **replace: str) -> Path:
    """A folder for PYTHONPATH with a fake top-level ``jax``; ``replace`` maps a file of it
    to other text (an empty module stands for a jax whose internals differ)."""
    folder = tmp_path / "fake"
    for name, text in (FAKE_JAX | replace).items():
        (folder / "jax" / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / "jax" / name).write_text(text)
    return folder


def warnings_in(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("gpu-cache: warning")]


def same_as_without_the_hook(code: str, hooked: dict[str, str], fake: Path, *,
                             cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``code`` with the hook and without it: same exit code and stdout, and stderr
    differs by one gpu-cache warning line at most. Returns the hooked run."""
    bare = clean_environ(PYTHONPATH=os.pathsep.join([str(fake), str(SCRIPTS)]))
    runs = [subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True,
                           text=True, timeout=60) for env in (bare, hooked)]
    plain, done = runs
    assert (done.returncode, done.stdout) == (plain.returncode, plain.stdout), done.stderr
    others = [line for line in done.stderr.splitlines() if not line.startswith("gpu-cache: warning")]
    assert others == plain.stderr.splitlines()
    assert len(warnings_in(done.stderr)) <= 1, done.stderr
    return done


def plant_node_local(base: Path, plant: str, kind: str) -> tuple[Path, Path]:
    """A $TMPDIR (1777) in which user nobody made gpu-cache-<uid>/<kind> first, with a file in
    it: 0777, or 0755 of nobody's, or inside a 0777 gpu-cache-<uid> of ours; or (``ours 0777,
    ours``) where that 0777 gpu-cache-<uid> holds a <kind> folder of ours, which anyone may rename
    away and replace with theirs. Returns the $TMPDIR and gpu-cache-<uid>."""
    tmp = base / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    planted = tmp / f"gpu-cache-{os.getuid()}"
    if plant.startswith("ours"):
        planted.mkdir()
        planted.chmod(0o777)
    mode = "0755" if plant == "nobody's 0755" else "0777"
    script = f"mkdir -p -m {mode} {planted}/{kind} && echo evil > {planted}/{kind}/planted"
    if plant == OURS_IN_0777:
        (planted / kind).mkdir()
        (planted / kind / "planted").write_text("evil\n")
    else:
        subprocess.run(["runuser", "-u", "nobody", "--", "sh", "-c", script], check=True)
    return tmp, planted


def tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


NOBODY = pwd.getpwnam("nobody").pw_uid
PLANTS = ["nobody's 0777", "nobody's 0755", "ours 0777, nobody's triton"]
#: A folder of ours in a 0777 gpu-cache-<uid> of ours (another user may swap it for theirs).
OURS_IN_0777 = "ours 0777, ours"
#: Why each is refused, naming the real cause: /tmp's sticky bit protects only an entry of one's
#: own (as ssh's StrictModes judges it), so nobody's gpu-cache-0 is refused already above it.
REFUSED = {"nobody's 0777": f"is owned by user {NOBODY}, not by you: another user made it in",
           "nobody's 0755": f"is owned by user {NOBODY}, not by you: another user made it in",
           "ours 0777, nobody's triton": "world-writable", OURS_IN_0777: "world-writable"}


def real_tokamax() -> None:
    try:
        version = metadata.version("tokamax")
    except metadata.PackageNotFoundError:
        version = None
    if version != "0.0.12":
        unavailable(f"tokamax 0.0.12 is not installed here (found {version}): pip install tokamax==0.0.12")


def gpu_cache_env(root: Path, **extra: str) -> dict[str, str]:
    """A job's environment as ``gpu-cache env`` exports it for ``root``, on CPU."""
    base = clean_environ(JAX_PLATFORMS="cpu")
    return env.job_environ(env.resolve(settings_from({}, cache_root=str(root)), base), base, **extra)


#: A warm process: tunes the GLU of one shape (the config sorted last is the fastest).
WARM_PROGRAM = """
import jax, jax.numpy as jnp
from tokamax._src.autotuning import autotuner
from tokamax._src import benchmarking
from tokamax._src.ops.gated_linear_unit import pallas_triton

glu = pallas_triton.PallasTritonGatedLinearUnit()
x, w = jnp.ones((8, 16)), jnp.ones((16, 2, 32))
bound = glu.bind(x, w, activation=jax.nn.swish)

class FixedTimes(autotuner.Autotuner):  # stands for timing the kernels on a GPU
    def autotune(self, op_fn, configs, *args, **kwargs):
        ranked = sorted(configs, key=str)
        return autotuner.AutotuningData({c: benchmarking.BenchmarkData(1.0, 1.0, (10.0 - i,), {})
                                         for i, c in enumerate(ranked)})

configs = sorted(glu._get_autotuning_configs(bound), key=str)[:3]
bound.autotune(set(configs), autotuner=FixedTimes())
print(configs[-1])
"""


#: A job: the GLU looked up while tracing (three calls of one jit) and in a second thread.
JOB_PROGRAM = """
import json, threading
import jax, jax.numpy as jnp
from tokamax._src.ops.gated_linear_unit import pallas_triton

glu = pallas_triton.PallasTritonGatedLinearUnit()
x, w = jnp.ones((8, 16)), jnp.ones((16, 2, 32))
out = {"traces": 0}

def config():
    data = glu.bind(x, w, activation=jax.nn.swish).cached_autotuning_data
    return None if data is None else str(data.fastest_config)

@jax.jit
def glu_step(x, w):
    out["traces"] += 1
    out["main"] = config()
    return jax.nn.swish(x @ w[:, 0]) * (x @ w[:, 1])

for _ in range(3):
    glu_step(x, w).block_until_ready()
thread = threading.Thread(target=lambda: out.update(other=config()))
thread.start()
thread.join()
out["compiled"] = glu_step._cache_size()
print(json.dumps(out))
"""


def run(code: str, environ: dict[str, str], umask: int = -1) -> tuple[str, str]:
    done = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True,
                          text=True, timeout=600, umask=umask)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not warnings_in(done.stderr), done.stderr
    return done.stdout.splitlines()[-1], done.stderr


def tuning_of(root: Path) -> dict:
    """The autotuning part of the latest record."""
    latest = max(records_of(root), key=lambda r: r["time"])
    return latest["autotune"]["autotuning"]
