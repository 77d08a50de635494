"""Two (or more) nodes on one machine, for single-flight across nodes.

Each node is a process tree in its own mount, UTS and PID namespace (``unshare --mount
--propagation private --uts --pid --fork --mount-proc``) with its own ``sshfs`` mount of one
export (``tests/harness/sshfs_mount.py``'s loopback sshd), as cluster nodes see a shared filesystem:
``flock`` through one sshfs mount excludes only the processes of that mount (of that node), a
node has its own hostname, and the pids of one node mean nothing on the other (a lease holder
on another node can only be judged by its beat). The node's first process is its init: when it
ends, the kernel ends every process left in the node, its sshfs included.

A node runs ``gpu-cache env --json`` for the cache root on its mount (as each job's
``eval "$(gpu-cache env)"`` would), then its jobs, together, and prints one JSON line: the
single-flight mode env chose, each job's exit code, stdout and stderr, and the CPU seconds of
all its jobs. Used by tests/test_flight_across_nodes.py and tests/benchmarks/two_nodes.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from sshfs_mount import SshfsMount

#: The node's init: mount, resolve the environment, run the jobs, unmount, report.
NODE = r'''
import json, os, resource, socket, subprocess, sys, time
spec = json.loads(sys.argv[1])
socket.sethostname(spec["name"])
point = spec["point"]
os.makedirs(point, exist_ok=True)
log = open(spec["log"], "ab")
sshfs = subprocess.Popen(spec["sshfs"], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

def mounted():
    with open("/proc/self/mounts") as table:
        return any(line.split()[1:3] == [point, "fuse.sshfs"] for line in table)

deadline = time.monotonic() + 30
while not mounted():
    if sshfs.poll() is not None or time.monotonic() > deadline:
        print(json.dumps({"name": spec["name"], "error": "sshfs did not mount"}), flush=True)
        sys.exit(1)
    time.sleep(0.05)
result = {"name": spec["name"]}
try:
    environ = dict(spec["env"])
    if spec["root"]:
        shown = subprocess.run([sys.executable, "-m", "gpu_cache", "env", "--json", "--cache-root",
                                spec["root"], "--config-json", spec["config"]], env=environ,
                               capture_output=True, text=True)
        report = json.loads(shown.stdout)
        result["single_flight"], result["tier"] = report["single_flight"], report["tier"]
        environ.update(report["exports"])
    environ.update(spec["override"])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    jobs = [subprocess.Popen(command, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for command in spec["commands"]]
    print(json.dumps({"started": [job.pid for job in jobs], "pidns": os.readlink("/proc/self/ns/pid")}),
          flush=True)
    outputs = [job.communicate() for job in jobs]
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result["runs"] = [{"returncode": job.returncode, "stdout": out, "stderr": err[-4000:]}
                      for job, (out, err) in zip(jobs, outputs)]
    result["cpu_seconds"] = round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 2)
finally:
    for unmount in (["fusermount3", "-u", point], ["umount", "-l", point]):
        if subprocess.run(unmount, capture_output=True).returncode == 0:
            break
    try:
        sshfs.wait(timeout=30)
    except subprocess.TimeoutExpired:
        sshfs.kill()
print(json.dumps(result), flush=True)
'''

#: One job: imports jax, says it is ready, waits for the go file, then jits ``keys`` chains of
#: different lengths (one cache key each) and prints one JSON line: the results, how many of its
#: compile requests JAX compiled and how many it loaded (jax.monitoring), and its seconds.
JOB = r'''
import json, os, sys, time
ready, go, keys, length = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
import jax, jax.numpy as jnp, numpy as np
from jax import monitoring
counts = {"requests": 0, "hits": 0}

def listen(event, **_):
    if event == "/jax/compilation_cache/compile_requests_use_cache":
        counts["requests"] += 1
    elif event == "/jax/compilation_cache/cache_hits":
        counts["hits"] += 1

monitoring.register_event_listener(listen)
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.002)
started, cpu = time.monotonic(), time.process_time()

def chain(n):
    def f(x):
        for i in range(n):
            x = jnp.tanh(x @ x.T * 0.01 + i) + jnp.sin(x * (i + 1))
        return x.sum()
    f.__name__ = f"chain{n}"
    return jax.jit(f)

x = np.ones((64, 64), np.float32)
values = [round(float(chain(length + k)(x)), 3) for k in range(keys)]
print(json.dumps({"values": values, "compiled": counts["requests"] - counts["hits"], "loaded": counts["hits"],
                  "seconds": round(time.monotonic() - started, 2),
                  "cpu_seconds": round(time.process_time() - cpu, 2)}), flush=True)
'''


def sshfs_command(share: SshfsMount, point: Path) -> list[str]:
    """The sshfs command that mounts ``share``'s export on ``point`` (run inside a node)."""
    sshfs = share_binary("sshfs")
    options = [f"IdentityFile={share.client_key}", "StrictHostKeyChecking=no", "UserKnownHostsFile=/dev/null",
               f"port={share.port}", "BatchMode=yes", "LogLevel=ERROR", *share.sshfs_options]
    return [sshfs, "-f", "-o", ",".join(options), f"{share.user}@127.0.0.1:{share.server_dir}", str(point)]


def share_binary(name: str) -> str:
    import shutil

    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") or name


class Node:
    """A node started with its jobs; :meth:`result` waits for its report."""

    def __init__(self, work: Path, share: SshfsMount, name: str, point: Path,
                 commands: Sequence[Sequence[str]], env: dict[str, str], root: Path | None = None,
                 config: dict | None = None, override: dict[str, str] | None = None) -> None:
        self.name = name
        program = work / "node.py"
        program.write_text(NODE)
        spec = {"name": name, "point": str(point), "sshfs": sshfs_command(share, point),
                "log": str(work / f"{name}.log"), "env": env, "root": str(root) if root else "",
                "config": json.dumps(config or {}), "override": override or {},
                "commands": [list(map(str, c)) for c in commands]}
        self.proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--uts", "--pid",
                                      "--kill-child", "--mount-proc", sys.executable, str(program),
                                      json.dumps(spec)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        started = json.loads(line) if line.strip() else {}
        if "started" not in started:
            out, err = self.proc.communicate(timeout=60)
            raise RuntimeError(f"node {name} did not start its jobs: {line}{out}{err[-3000:]}")
        #: The node's jobs, as pids of this (the host's) pid namespace.
        self.jobs = [host_pid(started["pidns"], pid) for pid in started["started"]]

    def result(self, timeout: float = 600) -> dict:
        out, err = self.proc.communicate(timeout=timeout)
        lines = out.strip().splitlines()
        if self.proc.returncode != 0 or not lines:
            raise RuntimeError(f"node {self.name} failed ({self.proc.returncode}): {out}{err[-3000:]}")
        return json.loads(lines[-1])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # unshare: its node's init (pid 1) dies with it, and the node with that
            self.proc.communicate()


def job_commands(work: Path, tag: str, count: int, keys: int, length: int = 3) -> list[list[str]]:
    """``count`` JOB command lines, their ready files named ``<tag><i>`` in ``work/sync``."""
    program = work / "job.py"
    program.write_text(JOB)
    sync = work / "sync"
    sync.mkdir(exist_ok=True)
    return [[sys.executable, str(program), str(sync / f"{tag}{i}"), str(sync / "go"), str(keys), str(length)]
            for i in range(count)]


def wait_ready(work: Path, count: int, nodes: Sequence[Node], timeout: float = 300) -> None:
    """Wait until ``count`` jobs said they are ready (jax imported)."""
    deadline = time.monotonic() + timeout
    sync = work / "sync"
    while len([p for p in sync.iterdir() if p.name != "go"]) < count:
        for node in nodes:
            if node.proc.poll() is not None:
                raise RuntimeError(f"node {node.name} ended early: {node.proc.communicate()}")
        if time.monotonic() > deadline:
            raise RuntimeError("the jobs never became ready")
        time.sleep(0.02)


def go(work: Path) -> float:
    (work / "sync" / "go").touch()
    return time.monotonic()


def host_pid(pidns: str, pid: int) -> int | None:
    """The pid, as this namespace sees it, of process ``pid`` of the pid namespace ``pidns``
    (as ``/proc/self/ns/pid`` names it there)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/pid") != pidns:
                continue
            with open(f"/proc/{entry}/status") as status:
                for line in status:
                    if line.startswith("NSpid:") and int(line.split()[-1]) == pid:
                        return int(entry)
        except (OSError, ValueError):
            continue
    return None


def has_open_below(pid: int, folder: Path, suffix: str) -> bool:
    """Whether process ``pid`` has a file ``folder/*<suffix>`` open (the path as it sees it)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(f"{folder}/") and target.endswith(suffix):
            return True
    return False


def lease_holder(path: Path) -> tuple[str, int, str] | None:
    """``(host, pid, pidns)`` from a lease file, or None while it cannot be read."""
    try:
        fields = dict(line.split(" ", 1) for line in path.read_text().splitlines()[1:] if " " in line)
        return fields["host"], int(fields["pid"]), fields["pidns"]
    except (OSError, KeyError, ValueError):
        return None


def leader_fault(work: Path, share: SshfsMount, fault: str, points: tuple[Path, Path], env: dict[str, str],
                 config: dict, length: int = 600) -> dict:
    """Node A's only job takes a key's lease (a compile of seconds: a chain of 600, 12 s here; one
    of 60 took 1.7 s and could end before the fault); once node B's job waits on it (B holds its
    node's lock), A's job runs on for 1.5 s (B watches its lease beat), is stopped again, and then
    gets ``fault`` (SIGKILL or SIGSTOP), so the fault lands mid-compile on any machine. Returns when
    B went on (made the next lease), in seconds after the signal, and both nodes' reports (a
    stopped A is resumed once B finished). ``points``: the two nodes' mount points."""
    import signal

    folder = share.server_dir / "cache" / "locks" / "jax"
    nodes: list[Node] = []
    leader = None
    try:
        nodes.append(Node(work, share, "node-a", points[0], job_commands(work, "A", 1, 1, length), env,
                          root=points[0] / "cache", config=config))
        wait_ready(work, 1, nodes)
        go(work)
        deadline = time.monotonic() + 120
        while not (folder.is_dir() and list(folder.glob("*.0.lease"))):
            if time.monotonic() > deadline or nodes[0].proc.poll() is not None:
                raise RuntimeError("node A never took a lease")
            time.sleep(0.005)
        (lease,) = folder.glob("*.0.lease")
        while lease_holder(lease) is None:
            time.sleep(0.005)
        leader = nodes[0].jobs[0]
        os.kill(leader, signal.SIGSTOP)  # held mid-compile until node B waits on its lease
        nodes.append(Node(work, share, "node-b", points[1], job_commands(work, "B", 1, 1, length), env,
                          root=points[1] / "cache", config=config))
        while not has_open_below(nodes[1].jobs[0], points[1] / "cache" / "locks" / "jax", ".lock"):
            if time.monotonic() > deadline or nodes[1].proc.poll() is not None:
                raise RuntimeError("node B never waited")
            time.sleep(0.005)
        os.kill(leader, signal.SIGCONT)
        time.sleep(1.5)  # B watches the lease beat, mid-compile (the compile takes seconds)
        os.kill(leader, signal.SIGSTOP)  # the fault lands mid-compile, however fast this machine is
        alive = lease.exists() and not list(folder.glob("*.1.lease"))
        if list((share.server_dir / "cache" / "jax").glob("*-cache")):
            raise RuntimeError("node A finished its compile before the fault: make the chain longer")
        os.kill(leader, getattr(signal, fault))
        signalled = time.monotonic()
        taken = None
        while taken is None:
            for path in folder.glob("*.1.lease"):
                if (lease_holder(path) or ("",))[0] == "node-b":
                    taken = time.monotonic()
            if time.monotonic() - signalled > 120 or nodes[1].proc.poll() is not None:
                raise RuntimeError("node B never went on")
            time.sleep(0.005)
        result_b = nodes[1].result()
        if fault == "SIGSTOP":
            os.kill(leader, signal.SIGCONT)
        result_a = nodes[0].result()
    finally:
        if leader is not None and fault == "SIGSTOP":
            try:
                os.kill(leader, signal.SIGCONT)
            except ProcessLookupError:
                pass
        for node in nodes:
            node.kill()
    return {"fault": fault, "went_on": round(taken - signalled, 2), "lease_alive_before": alive,
            "a": result_a, "b": result_b}
