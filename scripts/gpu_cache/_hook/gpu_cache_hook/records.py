"""gpu-cache's startup hook, the record: loaded at exit in a process that imported a module a
kind's piece watches, and only then.

One JSON record per process into ``$GPU_CACHE_RECORDS``: the host, the job (its rule and
wildcards, from ``$GPU_CACHE_RULE`` or the ``snakemake --target-jobs`` that runs it), the
variables that change cache keys, the software, and the part of each kind whose piece this
process loaded (the piece's ``section(hook)``; the record's ``device``, from the first piece
loaded that says what the process compiled for). Records are
small (at most ``MAX_ITEMS`` names per list, the rest counted in ``dropped``) and written
without following symlinks: a records folder that is a symlink is refused, and the record is
created under a unique temporary name (``.<name>-<random>.json.tmp``, which prune removes
when stale) with ``O_CREAT | O_EXCL | O_NOFOLLOW``, then renamed. Standard library only,
Python 3.9+.
"""

import os
import sys

from . import common, owners
from .common import text
from .names import (
    GPU_TYPE_VAR,
    IMAGE_VARIABLES,
    RECORDS_VAR,
    RULE_VAR,
    RUN_ID_VAR,
    WILDCARDS_VAR,
    environment,
)

_RECORD_VERSION = 1


def _proc(path, limit):
    """At most ``limit`` bytes of a /proc file."""
    with open(path, "rb") as stream:
        return stream.read(limit)


def _snakemake_target(max_depth=12):
    """``(rule, wildcards)`` from the nearest ancestor ``snakemake ... --target-jobs R:W``.

    Snakemake gives a job's environment no rule name. But every job it runs in a process
    of its own (a SLURM job: the job script's and srun's ``python -m snakemake``; any
    remote executor) is run by a snakemake started with ``--target-jobs 'rule:wc=value'``.
    Local shell jobs of the main process have no such ancestor: ``(None, None)``.
    """
    pid = os.getppid()
    for _ in range(max_depth):
        if pid <= 1:
            break
        try:
            argv = _proc(f"/proc/{pid}/cmdline", 1 << 20).decode("utf-8", "replace").split("\0")
            stat = _proc(f"/proc/{pid}/stat", 1 << 16).decode("utf-8", "replace")
        except OSError:
            break
        if "--target-jobs" in argv and any("snakemake" in a for a in argv[:3]):
            at = argv.index("--target-jobs") + 1
            if at < len(argv):
                rule, _, wildcards = argv[at].strip("'\"").partition(":")
                return text(rule) or None, text(wildcards) or None
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return None, None


def _job_info(hook):
    env = os.environ
    rule, wildcards = env.get(RULE_VAR), env.get(WILDCARDS_VAR)
    if not rule:
        try:
            rule, wildcards = _snakemake_target()
        except Exception as exc:  # /proc missing or odd: the record just has no rule
            hook.warn("finding the snakemake job", exc)
    return {
        "gpu_type": env.get(GPU_TYPE_VAR),
        "rule": rule,
        "wildcards": wildcards,
        "slurm_job_id": env.get("SLURM_JOB_ID"),
        "run_id": env.get(RUN_ID_VAR),
        "env": {name: env.get(name) for name in environment(hook.pieces)},
    }


def _record(hook, time, socket):
    argv = getattr(sys, "argv", None)  # an embedded interpreter may have none
    record = {"version": _RECORD_VERSION, "time": time.time(), "host": socket.gethostname(),
              "pid": os.getpid(),
              "argv": [text(a) for a in argv[:3]] if isinstance(argv, (list, tuple)) else [],
              **_job_info(hook), "libraries": sorted(hook.libraries)}
    for piece, module in list(hook.loaded):  # each kind's part, from the pieces this process loaded
        section = getattr(module, "section", None)
        part = section(hook) if section is not None else None
        if part is not None:
            record[piece.kind] = part
        device = getattr(module, "device", None)
        if "device" not in record and device is not None:  # the first library imported that says
            found = device(hook)
            if found is not None:
                record["device"] = found
    if "fallbacks" in hook.parts:  # the hook's own: the folders it refused or made
        record["fallbacks"] = hook.parts["fallbacks"]
    record["software"] = _software(hook)
    return record


def _software(hook):
    """This process's software, as gpu_cache.core.software.identity() names it (the record of a
    job is compared with the software that warmed its GPU type's cache): the distributions the
    pieces declare."""
    import platform
    from importlib import metadata

    out = {"python": platform.python_version(), "executable": text(sys.executable)}
    for name in (name for piece in hook.pieces for name in piece.software):
        try:
            out[name] = metadata.version(name)
        except Exception:
            out[name] = None
    out["image"] = next((os.environ[v] for v in IMAGE_VARIABLES if os.environ.get(v)), None)
    out["conda_env"] = os.environ.get("CONDA_PREFIX") or None
    return out


def _save(folder, name, data):
    """Write ``data`` as ``folder/name`` through a unique temporary file and a rename, never
    following a symlink: the folder itself must not be one (whoever could swap it for a link
    would send records outside the cache root), and the temporary file is created new."""
    import errno
    import stat

    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        folder_fd = os.open(folder, flags)
    except OSError as exc:  # ELOOP or ENOTDIR for a symlink, as the kernel decides
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and stat.S_ISLNK(os.lstat(folder).st_mode):
            raise OSError(exc.errno, "the records folder is a symbolic link: refused", folder) from None
        raise
    try:
        info = os.fstat(folder_fd)
        team = owners.team_gid(info)
        why = owners.owner_problem(info, team, where=folder_fd)
        if why is not None:  # its readers would take another user's records for this user's
            raise OSError(errno.EPERM, f"the records folder is {why}: refused", folder)
        temp = f".{name[:-len('.json')]}-{os.urandom(6).hex()}.json.tmp"
        # readable as the tools' files are, whatever the umask
        common.replace_whole(folder_fd, temp, name, data, common.safe_mode(team))
    finally:
        os.close(folder_fd)


def write(hook):
    """At exit: one record for a process that imported a watched module. Raises on failure (the
    caller warns once)."""
    import json
    import socket
    import time

    folder = hook.folder
    if not os.path.isabs(folder):
        raise ValueError(f"{RECORDS_VAR} is not an absolute path: {folder!r}")
    record = _record(hook, time, socket)
    host = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(record["host"]))[:100]
    name = f"{time.time_ns()}-{host}-{record['pid']}.json"
    data = json.dumps(record, default=str).encode("utf-8", "replace")
    common.make_folders(folder)
    _save(folder, name, data)
