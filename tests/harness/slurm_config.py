"""The configuration files of a test SLURM cluster (tests/harness/slurm_cluster.py): slurm.conf,
gres.conf with fake GPUs (character devices like ``/dev/null``) and slurmdbd.conf, written into
its configuration folder before its daemons start."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from daemons import Node

if TYPE_CHECKING:
    from slurm_cluster import SlurmCluster


def write(cluster: SlurmCluster) -> None:
    """slurm.conf, gres.conf and slurmdbd.conf of ``cluster``, in its ``conf_dir``."""
    munge_socket = cluster.munge_dir / "munge.socket.2"
    cluster.slurm_conf.write_text(slurm_conf(cluster, munge_socket))
    gres_lines = ["AutoDetect=off"] + [
        f"NodeName={node.hostname} Name=gpu Type={t} File={dev}"
        for node in cluster.nodes for t, dev in gpu_devices(cluster.dev_dir, node, cluster.gpus)
    ]
    (cluster.conf_dir / "gres.conf").write_text("\n".join(gres_lines) + "\n")
    dbd_conf = cluster.conf_dir / "slurmdbd.conf"
    dbd_conf.write_text(f"""\
AuthType=auth/munge
AuthInfo=socket={munge_socket}
DbdHost={cluster.head.hostname}
DbdAddr={cluster.head.address}
DbdPort={cluster.ports['slurmdbd']}
SlurmUser=root
PidFile={cluster.run_dir}/slurmdbd.pid
LogFile={cluster.log_dir}/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={cluster.ports['mysql']}
StorageUser=root
StorageLoc=slurm_acct_db
""")
    dbd_conf.chmod(0o600)  # slurmdbd refuses a config that others can read


def slurm_conf(cluster: SlurmCluster, munge_socket: Path) -> str:
    """slurm.conf: the head's daemons on its address and the cluster's ports, one line per
    compute node with its CPUs, memory and typed GPUs, one default partition."""
    gres = ",".join(f"gpu:{t}:{n}" for t, n in cluster.gpus.items() if n > 0)
    tres = ",".join(["gres/gpu"] + [f"gres/gpu:{t}" for t in cluster.gpus])
    nodes = "\n".join(f"NodeName={node.hostname} NodeAddr={node.address} CPUs={cluster.cpus} "
                      f"RealMemory={cluster.real_memory_mb} Gres={gres} State=UNKNOWN"
                      for node in cluster.nodes)
    return f"""\
# Written by tests/harness/slurm_cluster.py; everything as root.
ClusterName={cluster.cluster_name}
SlurmctldHost={cluster.head.hostname}({cluster.head.address})
SlurmctldPort={cluster.ports['slurmctld']}
SlurmdPort={cluster.ports['slurmd']}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={cluster.workdir}/state
SlurmdSpoolDir={cluster.workdir}/spool/slurmd-%n
SlurmctldPidFile={cluster.run_dir}/slurmctld.pid
SlurmdPidFile={cluster.run_dir}/slurmd-%n.pid
SlurmctldLogFile={cluster.log_dir}/slurmctld.log
SlurmdLogFile={cluster.log_dir}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge={cluster.min_job_age}
InactiveLimit=0
KillWait=2
Waittime=0
SlurmctldTimeout=30
SlurmdTimeout=60
MessageTimeout=20
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost={cluster.head.address}
AccountingStoragePort={cluster.ports['slurmdbd']}
AccountingStorageTRES={tres}
# For the slurmdbd connection the munge socket comes from AccountingStoragePass, not AuthInfo.
AccountingStoragePass={munge_socket}
MailProg=/bin/true
JobCompType=jobcomp/none
{nodes}
PartitionName={cluster.partition} Nodes={",".join(cluster.nodenames)} Default=YES MaxTime=INFINITE State=UP
"""


def gpu_devices(dev_dir: Path, node: Node, gpus: dict[str, int]) -> list[tuple[str, Path]]:
    """(type, device path) for every fake GPU of ``node``; creates the character devices."""
    devices = []
    folder = dev_dir / node.hostname
    folder.mkdir(parents=True, exist_ok=True)
    index = 0
    for gpu_type, count in gpus.items():
        for _ in range(count):
            dev = folder / f"nvidia{index}"
            if not dev.exists():
                os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))  # S_IFCHR, like /dev/null
            devices.append((gpu_type, dev))
            index += 1
    return devices
