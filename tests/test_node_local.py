"""Node-local folders judged on every node (issue 54): ``gpu-cache env`` hands a kind it cannot
switch off a folder in ``$TMPDIR/gpu-cache-<uid>/`` where the root cannot be used, and the profile
and SLURM carry that export to other nodes, where another account may have made the folder first.
Each "other node" here is a ``$TMPDIR`` the test controls, in which user ``nobody`` made the
folder (or a 0777 ``gpu-cache-<uid>`` of ours holds it): the job's startup hook refuses it before
any tool reads it, and the job runs on a private folder. (Triton's and the locks' cases:
tests/test_hook.py; that every such folder has a piece that declares it: tests/test_kinds.py.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import HOOK, SCRIPTS, clean_environ, unavailable
from hook_jobs import (
    FAKE_PROGRAM,
    OURS_IN_0777,
    PLANTS,
    REFUSED,
    WARM_PROGRAM,
    fake_jax,
    gpu_cache_env,
    plant_node_local,
    real_tokamax,
    run,
    same_as_without_the_hook,
    tree,
    warnings_in,
)

#: The plants of tests/test_hook.py, and a folder of ours that another account may swap.
NODE_PLANTS = [plant.replace(", nobody's triton", ", nobody's") for plant in PLANTS] + [OURS_IN_0777]
REASONS = {plant.replace(", nobody's triton", ", nobody's"): why for plant, why in REFUSED.items()}
#: What vLLM does with its root at start (vLLM is not installed here; the guard runs before any
#: code of the job): lists it, then writes its torch.compile artifacts below it.
VLLM_JOB = """
import json, os
root = os.environ["VLLM_CACHE_ROOT"]
seen = sorted(os.listdir(root))
folder = os.path.join(root, "torch_compile_cache", "0123abcd", "rank_0_0", "backbone")
os.makedirs(folder, exist_ok=True)
with open(os.path.join(folder, "inductor_cache.bin"), "w") as stream:
    stream.write("compiled")
print(json.dumps({"root": root, "seen": seen}))
"""


@pytest.fixture(autouse=True)
def _root():
    if os.geteuid() != 0:
        unavailable("needs root (runuser, chown)")


def job_environ(tmp: Path, records: Path, **variables: str) -> dict[str, str]:
    return clean_environ(TMPDIR=str(tmp), GPU_CACHE_RECORDS=str(records), JAX_PLATFORMS="cpu",
                         PYTHONPATH=os.pathsep.join([str(HOOK), str(SCRIPTS)]), **variables)


def refused_once(stderr: str, what: str, plant: str) -> None:
    (warning,) = warnings_in(stderr)
    assert f"node-local folder of {what}" in warning and "refused" in warning, warning
    assert REASONS[plant] in warning and "private folder" in warning


@pytest.mark.parametrize("plant", NODE_PLANTS)
def test_a_vllm_folder_another_account_made_first_on_a_node_is_never_used(base, plant):
    """``VLLM_CACHE_ROOT`` exported node-local, where another account made that folder first on
    this node: the job neither lists nor writes it, and compiles into a private folder. Guard:
    the vllm piece's ``node-local VLLM_CACHE_ROOT`` (without the piece: the job saw ``planted``
    and wrote its artifacts there)."""
    tmp, planted = plant_node_local(base, plant, "vllm")
    before = tree(planted)
    environ = job_environ(tmp, base / "records", VLLM_CACHE_ROOT=str(planted / "vllm"))
    done = subprocess.run([sys.executable, "-c", VLLM_JOB], env=environ, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["seen"] == [] and Path(planted) not in Path(out["root"]).parents
    assert tree(planted) == before  # nothing read from it, nothing written into it
    refused_once(done.stderr, "VLLM_CACHE_ROOT", plant)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A result tokamax's warm step saved (real tokamax and JAX on CPU): its ``cpu.json``."""
    real_tokamax()
    root = tmp_path_factory.mktemp("warmed") / "root"
    run(WARM_PROGRAM, gpu_cache_env(root, GPU_CACHE_AUTOTUNE_SAVE="1"))
    (result,) = (root / "autotune").glob("*/cpu.json")
    return result


@pytest.mark.slow
@pytest.mark.parametrize("plant", NODE_PLANTS)
def test_an_autotune_folder_another_account_made_first_on_a_node_is_never_read(base, tuned, plant):
    """``GPU_CACHE_AUTOTUNE`` exported node-local, where another account made that folder first
    on this node (or may swap ours: a 0777 ``gpu-cache-<uid>``), holding a result that decides
    which kernels tokamax runs: the job enters no result from it and the record says why.
    Guard: the autotune piece's ``node-local GPU_CACHE_AUTOTUNE`` (without it: the result in the
    swappable folder was entered, and the others were refused only by the piece's owner check,
    which judges neither ``gpu-cache-<uid>`` nor the folders above it)."""
    tmp, planted = plant_node_local(base, plant, "autotune")
    result = planted / "autotune" / tuned.parent.name / tuned.name
    if plant == OURS_IN_0777:
        result.parent.mkdir()
        shutil.copyfile(tuned, result)
    else:
        script = f"mkdir {result.parent} && cat > {result}"
        subprocess.run(["runuser", "-u", "nobody", "--", "sh", "-c", script], input=tuned.read_bytes(),
                       check=True)
    before = tree(planted)
    records = base / "records"
    environ = job_environ(tmp, records, GPU_CACHE_AUTOTUNE=str(planted / "autotune"))
    done = subprocess.run([sys.executable, "-c", "import jax, tokamax"], env=environ, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (record,) = [json.loads(p.read_text()) for p in records.glob("*.json")]
    tuning = record["autotune"]["autotuning"]
    assert (tuning["loaded"], tuning["refused"]) == ([], [])
    assert REASONS[plant] in record["fallbacks"]["autotune"]["refused"]
    assert tree(planted) == before
    refused_once(done.stderr, "GPU_CACHE_AUTOTUNE", plant)


@pytest.mark.parametrize("plant", NODE_PLANTS)
def test_a_records_folder_another_account_may_write_on_a_node_gets_no_record(base, tmp_path, plant):
    """``GPU_CACHE_RECORDS`` exported node-local (a records folder of a root that cannot be
    used), where another account made it first on this node, or may swap ours: the job runs as
    without the hook and writes no record there (whoever may write it decides what stats and
    the replay read of this user's jobs). Guard: the start-up guard's own ``GPU_CACHE_RECORDS``
    (skipped: the record went into the folder of ours in the 0777 ``gpu-cache-<uid>``)."""
    tmp, planted = plant_node_local(base, plant, "records")
    before = tree(planted)
    fake = fake_jax(tmp_path)
    environ = job_environ(tmp, planted / "records")
    environ["PYTHONPATH"] = os.pathsep.join([str(HOOK), str(fake), str(SCRIPTS)])
    done = same_as_without_the_hook(FAKE_PROGRAM, environ, fake)
    assert tree(planted) == before
    (warning,) = warnings_in(done.stderr)
    assert "node-local folder of GPU_CACHE_RECORDS" in warning and REASONS[plant] in warning, warning
