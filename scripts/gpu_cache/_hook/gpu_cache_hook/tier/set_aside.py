"""gpu-cache's startup hook: the node-local tier drops its copies of entries set aside in the
shared root (issue 40; ``tier``).

When validation finds that a process was served entries that compute something else than a
fresh compile, it removes them from the cache root and adds their keys to the kind's list
``<root>/state/set-aside-<kind>.json`` (``gpu_cache.core.set_aside``; a record per set-aside,
each with an id). The node-local tier of every node may still hold copies of them (fetched
before, or the very copies that were served): once per process and kind, before the tier
serves anything of that kind, :func:`check` compares the list's state (one ``stat`` on the
share: its size, mtime and inode) with this node's mark of the list it applied
(``<local>/.gpu-cache-set-aside.<kind>.<state>``, one local ``stat``). Only when the list
changed does it read it, remove the local copies of the keys of each record this node has not
applied yet, and mark the list applied. Without a list (nothing was ever set aside) it costs
one ``stat`` that finds nothing.

A key names an entry the way the startup hook's records do, whatever the kind: the local copy
is every file or folder, at any depth of the kind folder, named the key or ``<key>-<suffix>``
(JAX's ``<key>-cache`` and ``-atime``, a Triton key folder, an Inductor graph's folder below
``fxgraph/<shard>/``, a jax-triton kernel file). A folder is renamed away first (a reader sees
a miss, never part of it), then deleted. Nothing is followed through a link, and nothing but
the tier's own copies is removed. A list, or a state folder, that another account may have
written (the trust rule of an entry in the shared root) is not read: one warning line, and
nothing dropped (it would make every node drop what that account chose). Standard library
only, Python 3.9+.
"""

import errno
import json
import os
import stat

from ..names import SET_ASIDE_PREFIX, SET_ASIDE_SEEN, STATE_FOLDER, TEMP_PREFIX
from ..owners import owner_problem
from . import files

#: A list or mark larger than this is none gpu-cache wrote.
LIMIT = 16 << 20


def list_path(shared_root, kind):
    """The set-aside list of ``kind`` in the shared root."""
    return os.path.join(shared_root, STATE_FOLDER, f"{SET_ASIDE_PREFIX}{kind}.json")


def check(tier, kind):
    """Drop this node's local copies of the entries of ``kind`` set aside in the shared root
    since this node last looked. Returns how many keys it dropped copies of. Raises OSError,
    ValueError (the list or the tier cannot be read: nothing is marked, the next process
    tries again)."""
    try:
        info = os.stat(list_path(tier.shared.root, kind))
    except FileNotFoundError:
        return 0  # nothing was ever set aside
    mark = f"{SET_ASIDE_SEEN}{kind}.{info.st_size}-{info.st_mtime_ns}-{info.st_ino}"
    if os.path.lexists(os.path.join(tier.local.root, mark)):
        return 0  # applied on this node already
    records = _records(list_path(tier.shared.root, kind), tier.shared.team_gid)
    root = os.open(tier.local.root, files.DIR)
    try:
        marks = [n for n in os.listdir(root) if n.startswith(f"{SET_ASIDE_SEEN}{kind}.")]
        applied = set()
        for name in marks:
            applied.update(_ids(root, name))
        keys = {key for record in records if record["id"] not in applied for key in record["keys"]}
        removed = purge(tier.local.folder(kind), keys, tier.host) if keys else 0
        _mark(root, mark, [record["id"] for record in records])
        for name in marks:
            if name != mark:
                try:
                    os.unlink(name, dir_fd=root)
                except FileNotFoundError:
                    pass  # another process of this node replaced it too
    finally:
        os.close(root)
    return removed


def _read(path, dir_fd=None, team=False):
    """The JSON of the regular file ``path``; ``team`` (not False): it is the shared root's, read
    by the trust rule of an entry there (``team``: the group of a team's root, or None)."""
    fd = os.open(path, files.READ, dir_fd=dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path} is not a regular file")
        why = None if team is False else owner_problem(info, team, where=fd)
        if why:  # another account's list would steer which copies every node drops
            raise ValueError(f"{path} is {why}: not read (another user may have written it)")
        if info.st_size > LIMIT:
            raise ValueError(f"{path} is over {LIMIT} bytes")
        return json.loads(files.read_all(fd, info.st_size, LIMIT))
    finally:
        os.close(fd)


def _records(path, team):
    """The list's records: each an ``id`` and the ``keys`` it set aside (plain names only); the
    list and its folder must pass the trust rule (``team``: the group of a team's root)."""
    folder = os.path.dirname(path)
    info = os.stat(folder, follow_symlinks=False)
    why = "not a folder" if not stat.S_ISDIR(info.st_mode) else owner_problem(info, team, where=folder)
    if why:
        raise ValueError(f"{folder} is {why}: its lists are not read")
    found = _read(path, team=team)
    records = found.get("records") if isinstance(found, dict) else None
    if not isinstance(records, list):
        raise ValueError(f"{path} holds no records")
    return [{"id": r["id"], "keys": {k for k in r["keys"] if files.plain(k)}} for r in records
            if isinstance(r, dict) and isinstance(r.get("id"), str) and isinstance(r.get("keys"), list)]


def _ids(root, name):
    """The ids of the records a mark says this node applied (none where it cannot be read: its
    records are applied again, which only drops copies that may be fetched again)."""
    try:
        found = _read(name, root)
    except (OSError, ValueError):
        return set()
    return {i for i in found if isinstance(i, str)} if isinstance(found, list) else set()


def _mark(root, name, ids):
    """Mark the list applied (after the copies are gone: a process that sees the mark may serve)."""
    try:
        fd = os.open(name, files.CREATE, 0o600, dir_fd=root)
    except FileExistsError:
        return  # another process of this node applied the same list
    try:
        files.write_all(fd, [json.dumps(ids).encode()])
    finally:
        os.close(fd)


def purge(folder, keys, host):
    """Remove every file or folder below the kind folder ``folder`` (a descriptor) named a key
    of ``keys`` or ``<key>-<suffix>``. Returns how many keys had a copy."""
    removed = set()
    stack = [os.dup(folder)]
    while stack:
        fd = stack.pop()
        try:
            for name in os.listdir(fd):
                if name.startswith("."):
                    continue  # temporary files, locks, marks: no entry
                try:
                    mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
                except FileNotFoundError:
                    continue
                key = name if name in keys else name.rsplit("-", 1)[0]
                if key in keys:
                    if _remove(fd, name, stat.S_ISDIR(mode), host):
                        removed.add(key)
                elif stat.S_ISDIR(mode):
                    stack.append(os.open(name, files.DIR, dir_fd=fd))
        finally:
            os.close(fd)
    return len(removed)


def _remove(fd, name, folder, host):
    """Remove the file or folder ``name`` of the folder ``fd`` (a folder renamed away first).
    Whether it was there to remove."""
    try:
        if not folder:
            os.unlink(name, dir_fd=fd)
            return True
        away = f"{TEMP_PREFIX}{host}.{os.getpid()}.{os.urandom(6).hex()}"
        os.rename(name, away, src_dir_fd=fd, dst_dir_fd=fd)
    except FileNotFoundError:
        return False  # another process of this node removed it
    _delete(fd, away)
    return True


def _delete(parent, name):
    """Delete ``name`` of the folder ``parent`` and everything in it, never through a link. It
    is renamed away already: what cannot be deleted is no entry any more."""
    try:
        os.unlink(name, dir_fd=parent)
        return
    except OSError as exc:
        if exc.errno not in (errno.EISDIR, errno.EPERM):
            return
    try:
        fd = os.open(name, files.DIR, dir_fd=parent)
    except OSError:
        return
    try:
        for child in os.listdir(fd):
            _delete(fd, child)
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=parent)
    except OSError:
        pass
