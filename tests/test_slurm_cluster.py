"""Real-SLURM tests: the test cluster itself, and Snakemake's SLURM executor plugin on it.

Findings (snakemake 9.27.1, snakemake-executor-plugin-slurm 2.8.0,
snakemake-executor-plugin-slurm-jobstep 0.6.1, SLURM 22.05.8), measured on
this cluster, are recorded next to the tests that prove them:

* GPU type per rule: both ``resources: gres="gpu:h100:1"`` (plugin submits
  ``--gres=gpu:h100:1``, scontrol ``TresPerNode=gres:gpu:h100:1``) and
  ``resources: gpu=1, gpu_model="a100"`` (plugin submits ``--gpus=a100:1``,
  scontrol ``TresPerJob=gres:gpu:a100:1``) allocate the right type; sacct
  ``AllocTRES`` shows ``gres/gpu:<type>=1``. ``constraint="h100"`` is NOT a GPU
  type selector: it selects node *features* (rejected here with "Invalid
  feature specification" because the node has no ``Features=``) and on a node
  with mixed GPU types it cannot pick the type. ``slurm_extra="--gres=..."``
  is rejected by the plugin (FACTS.md).
* The plugin's job step (slurm-jobstep) deletes every ``SLURM_*`` variable,
  ``SLURM_CONF`` included, before it runs ``srun`` inside the job, so that
  ``srun`` must find the configuration at a default path:
  ``SlurmCluster`` links ``/run/slurm/conf`` to its config directory.
  Without it every job fails with "srun: fatal: Could not establish a
  configuration source".
* Speed / no hang: ``slurm-init-seconds-before-status-checks: 1`` (default
  40 s). After each status check that sees no finished job, the plugin adds
  10 s to the interval, and ``--seconds-between-status-checks`` does not change
  that. Measured for two ~4 s jobs: init 1 s -> 14.3 s for the whole run;
  init 1 s plus ``--seconds-between-status-checks 1`` -> 14.5 s; init 6 s ->
  29.7 s (the first check comes too early, the next one 16 s later). With
  ``MinJobAge=600`` (>= 3 x the initial interval) the plugin uses ``squeue``;
  ``--slurm-status-command sacct`` takes the same time (14.6 s), because
  slurmdbd is running. Without slurmdbd, sacct fails and Snakemake hangs
  (FACTS.md). ``--slurm-requeue`` is not needed. The partition needs no setting (the cluster's default
  partition is used). The account cannot be guessed (harmless warning "Unable to
  guess SLURM account. Trying to proceed without."); ``--slurm-no-account``
  does not silence it in 2.8.0.
* Environment: a variable set in the parent snakemake process reaches the
  job's shell (``sbatch --export=ALL``). The job re-parses the Snakefile:
  ``os.environ.setdefault(...)`` at parse time inside the job does reach the
  job's shell, but for a variable the parent had already set, the
  parent's value (exported) wins, since ``setdefault`` then does nothing.
  ``SLURM_JOB_GPUS`` is not visible in the rule's shell (the jobstep drops
  it); ``CUDA_VISIBLE_DEVICES`` is (``0`` for the h100, ``1`` for the a100:
  SLURM uses the device's index on the node, not 0 per job, with
  ``AutoDetect=off``).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from slurm_cluster import SlurmCluster, SlurmClusterError, pid_alive, processes_referencing

pytestmark = pytest.mark.slurm

SNAKEMAKE_TIMEOUT_S = 150


def _env_file(path: Path) -> dict[str, str]:
    """Parse ``KEY=VALUE`` lines written by ``env``."""
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return dict(pairs)


# ----------------------------------------------------------------- plain sbatch


@pytest.mark.parametrize("gpu_type", ["h100", "a100"])
def test_sbatch_gres_gets_cuda_visible_devices(
    slurm_cluster: SlurmCluster, tmp_path: Path, gpu_type: str
) -> None:
    out = tmp_path / "job.out"
    job_id = slurm_cluster.sbatch(
        "#!/bin/sh\nenv | grep -E '^(CUDA_VISIBLE_DEVICES|SLURM_JOB_GPUS)='\n",
        f"--gres=gpu:{gpu_type}:1", f"--output={out}",
    )
    assert slurm_cluster.wait_job(job_id, timeout=60) == "COMPLETED"
    env = _env_file(out)
    assert env.get("CUDA_VISIBLE_DEVICES", "") != "", out.read_text()
    show = slurm_cluster.show_job(job_id)
    assert show["TresPerNode"] == f"gres:gpu:{gpu_type}:1", show
    rows = slurm_cluster.wait_accounted(job_id)  # sacct lags behind scontrol a little
    assert rows[0]["State"] == "COMPLETED", rows
    assert f"gres/gpu:{gpu_type}=1" in rows[0]["AllocTRES"], rows


def test_two_gpu_types_run_concurrently(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """Both fake GPUs can be allocated at once, to different jobs, on the one node."""
    jobs = {
        t: slurm_cluster.sbatch(
            "#!/bin/sh\nsleep 4\necho CVD=$CUDA_VISIBLE_DEVICES\n",
            f"--gres=gpu:{t}:1", f"--output={tmp_path / (t + '.out')}",
        )
        for t in ("h100", "a100")
    }
    wanted = {str(j) for j in jobs.values()}
    running: list[str] = []
    deadline = time.monotonic() + 20  # slurmctld starts pending jobs about once a second
    while time.monotonic() < deadline:
        running = slurm_cluster.run(["squeue", "-h", "-t", "R", "-o", "%i"]).stdout.split()
        if wanted <= set(running):
            break
        time.sleep(0.2)
    assert wanted <= set(running), running
    cvd = set()
    for t, job_id in jobs.items():
        assert slurm_cluster.wait_job(job_id) == "COMPLETED"
        cvd.add((tmp_path / f"{t}.out").read_text().strip())
    assert len(cvd) == 2, cvd  # different devices


# ------------------------------------------------------------ cluster lifecycle


def test_stop_leaves_nothing_running(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """A second, independent cluster starts next to the session's one and stops cleanly."""
    cluster = SlurmCluster(tmp_path / "second", link_default_conf=False)
    with cluster:
        pids = cluster.pids()
        assert set(pids) == {"munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd"}
        assert cluster.start_seconds is not None and cluster.start_seconds < 30
        job_id = cluster.sbatch("#!/bin/sh\nsleep 300\n", "--gres=gpu:a100:1")
        deadline = time.monotonic() + 20
        while cluster.job_state(job_id) != "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.2)
    assert not [name for name, pid in pids.items() if pid_alive(pid)]
    assert processes_referencing(str(tmp_path / "second")) == []
    assert cluster.runtime_dir is None
    assert slurm_cluster.running  # the session cluster was not touched


def test_restart_after_crash_cleans_stale_daemons(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """Daemons orphaned by a killed owner are killed by the next start, in any work directory."""
    workdir = tmp_path / "crashed"
    owner = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "harness" / "slurm_cluster.py"), str(workdir)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        assert owner.stdout is not None
        first = owner.stdout.readline()
        assert "SLURM cluster up" in first, first + owner.stdout.read()
        assert len(processes_referencing(str(workdir))) >= 5
    finally:
        owner.kill()  # SIGKILL: no cleanup; its daemons keep running
        owner.wait()
    assert len(processes_referencing(str(workdir))) >= 5
    # A new cluster in another directory (as in the next pytest session) finds the orphans.
    cluster = SlurmCluster(tmp_path / "next", link_default_conf=False)
    with cluster:
        assert processes_referencing(str(workdir)) == []
        assert cluster.run(["sinfo", "-h", "-N", "-o", "%t"]).stdout.strip() == "idle"
    assert processes_referencing(str(tmp_path / "next")) == []
    assert slurm_cluster.running  # a live cluster (owner alive) is never taken for an orphan


class _BrokenCluster(SlurmCluster):
    def _write_configs(self) -> None:
        super()._write_configs()
        with self.slurm_conf.open("a") as fh:
            fh.write("NoSuchOption=1\n")


def test_failed_start_raises_with_log_tail_and_cleans_up(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    cluster = _BrokenCluster(tmp_path / "broken", link_default_conf=False, start_timeout=20)
    with pytest.raises(SlurmClusterError) as err:
        cluster.start()
    message = str(err.value)
    assert "NoSuchOption" in message and "slurm" in message, message
    assert "--- slurm" in message  # log tails are included
    assert processes_referencing(str(tmp_path / "broken")) == []


# ------------------------------------------------------------ two nodes


def test_jobs_run_on_the_node_that_nodelist_names(slurm_two_nodes, two_nodes, tmp_path: Path) -> None:
    """Each job runs on the node it was sent to: its hostname, its own /tmp (not the host's, not
    the other node's), the one share at the same path, a job step (srun) on the same node."""
    shared = two_nodes.shared / "nodelist"
    two_nodes.host_path(shared).mkdir()
    two_nodes.host_path(shared / "input.txt").write_text("from the share\n")
    (tmp_path / "host-only").write_text("")
    script = textwrap.dedent(f"""\
        #!/bin/sh
        hostname
        cat {shared}/input.txt
        touch /tmp/job-$SLURM_JOB_ID
        echo $(ls /tmp | grep '^job-')
        test -e {tmp_path}/host-only && echo "the host's /tmp" || echo "its own /tmp"
        srun hostname
        """)
    sent: dict[int, str] = {}
    for node in (two_nodes.a, two_nodes.b, two_nodes.a):  # one after the other
        out = shared / f"{len(sent)}.out"
        job = slurm_two_nodes.sbatch(script, f"--nodelist={node.hostname}", "--gres=gpu:h100:1",
                                     f"--output={out}")
        sent[job] = node.hostname
        assert slurm_two_nodes.wait_job(job) == "COMPLETED"
        lines = two_nodes.host_path(out).read_text().splitlines()
        mine = {f"job-{j}" for j, host in sent.items() if host == node.hostname}
        assert lines == [node.hostname, "from the share", " ".join(sorted(mine)), "its own /tmp",
                         node.hostname], lines
        rows = slurm_two_nodes.wait_accounted(job, ["NodeList"])
        assert {row["NodeList"] for row in rows} == {node.hostname}, rows


def test_two_nodes_of_a_killed_owner_are_swept_and_stop_leaves_nothing(two_nodes) -> None:
    """Nodes and a SLURM cluster on them, left running by a SIGKILLed owner, are removed by the next
    start (their processes, namespaces and folder), and that one's stop leaves nothing; the live
    session's nodes are not touched."""
    from nodes import TwoNodes
    from processes import processes_in_netns

    owner = subprocess.Popen([sys.executable, str(Path(__file__).parent / "harness" / "nodes.py"), "--slurm"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    try:
        assert owner.stdout is not None
        lines = [owner.stdout.readline() for _ in range(6)]
        assert lines[0].startswith("nodes up") and lines[5].startswith("SLURM up"), \
            "".join(lines) + owner.stdout.read()
    finally:
        owner.kill()  # no cleanup: its nodes and daemons keep running
        owner.wait()
    crashed = [line.split(" netns ")[1].split(":")[0] for line in lines[1:5]]
    workdir = Path(lines[0].split(" share ")[1].split()[0]).parent
    assert all(processes_in_netns(f"/run/netns/{netns}") for netns in crashed)
    with TwoNodes() as fresh:
        assert not [netns for netns in crashed if Path("/run/netns", netns).exists()]
        assert not workdir.exists()
        assert fresh.a.run(["hostname"]).stdout.strip() == "gcnode-a"
        own = [node.netns for node in fresh.nodes.values()]
    assert not [netns for netns in own if Path("/run/netns", netns).exists()]
    assert two_nodes.b.run(["hostname"]).stdout.strip() == "gcnode-b"  # the session's nodes run on


# ------------------------------------------------- Snakemake SLURM executor plugin

SNAKEFILE = textwrap.dedent(
    """\
    import os

    # Parse-time environment: the SLURM job re-parses this file.
    os.environ.setdefault("GPU_CACHE_PARSE_PID", str(os.getpid()))
    if "SLURM_JOB_ID" in os.environ:  # only true when parsed inside the job
        os.environ.setdefault("GPU_CACHE_REMOTE_PARSE", "set-in-job-parse")

    ENV = 'env | grep -E "^(CUDA_VISIBLE_DEVICES|SLURM_JOB_ID|GPU_CACHE_[A-Z_]*)=" | sort > {output}'

    rule all:
        input: "h100.env", "a100.env"

    # Spelling 1: a GRES string -> sbatch --gres=gpu:h100:1
    rule on_h100:
        output: "h100.env"
        resources: gres="gpu:h100:1"
        shell: ENV

    # Spelling 2: count + model -> sbatch --gpus=a100:1
    rule on_a100:
        output: "a100.env"
        resources: gpu=1, gpu_model="a100"
        shell: ENV
    """
)

# Profile keys that make the plugin fast and hang-free on the test cluster.
PROFILE = textwrap.dedent(
    """\
    executor: slurm
    jobs: 4
    # default 40 s before the first status check; after that the plugin adds
    # 10 s per check that sees nothing finish
    slurm-init-seconds-before-status-checks: 1
    latency-wait: 5
    default-resources:
      - runtime=5
      - mem_mb=100
    """
)


def test_snakemake_slurm_executor_gpu_types_and_env(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    profile = tmp_path / "profile"
    profile.mkdir()
    (profile / "config.yaml").write_text(PROFILE)
    env = slurm_cluster.env
    env["GPU_CACHE_PROBE"] = "xyz"
    for leaked in ("GPU_CACHE_PARSE_PID", "GPU_CACHE_REMOTE_PARSE"):
        env.pop(leaked, None)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--profile", str(profile), "--nocolor"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )
    log = slurm_cluster.finish(proc, SNAKEMAKE_TIMEOUT_S, "snakemake --executor slurm")
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, log[-5000:]
    print(f"snakemake --executor slurm: {elapsed:.1f} s")

    for gpu_type in ("h100", "a100"):
        job_env = _env_file(tmp_path / f"{gpu_type}.env")
        # the job got a GPU ...
        assert job_env.get("CUDA_VISIBLE_DEVICES", "") != "", job_env
        # ... of the right type, per SLURM's accounting
        job_id = job_env["SLURM_JOB_ID"]
        rows = slurm_cluster.wait_accounted(job_id)
        assert rows[0]["State"] == "COMPLETED", rows
        assert f"gres/gpu:{gpu_type}=1" in rows[0]["AllocTRES"], rows
        other = "a100" if gpu_type == "h100" else "h100"
        assert f"gres/gpu:{other}" not in rows[0]["AllocTRES"], rows
        # the parent's environment reached the job (sbatch --export=ALL)
        assert job_env.get("GPU_CACHE_PROBE") == "xyz", job_env
        # parse-time setdefault in the job's own parse reaches the job's shell
        assert job_env.get("GPU_CACHE_REMOTE_PARSE") == "set-in-job-parse", job_env
        # for a variable the parent already set, the parent's (exported) value wins
        assert job_env.get("GPU_CACHE_PARSE_PID") == str(proc.pid), job_env
    show_h100 = slurm_cluster.show_job(_env_file(tmp_path / "h100.env")["SLURM_JOB_ID"])
    assert show_h100.get("TresPerNode") == "gres:gpu:h100:1", show_h100
    show_a100 = slurm_cluster.show_job(_env_file(tmp_path / "a100.env")["SLURM_JOB_ID"])
    assert show_a100.get("TresPerJob") == "gres:gpu:a100:1", show_a100
