"""gpu-cache's startup hook at start, in every process, before the job's code runs: the folders
the kinds' pieces declare judged and made, and single-flight's folder judged (``sitecustomize``
calls :func:`start`). Each costs a few string tests and a stat where the job has none of them;
``trust`` is loaded only where one is node-local or cannot be made. Standard library only,
Python 3.9+.
"""

import os

from .names import LOCKS_VAR, NODE_LOCAL_PREFIX, RECORDS_VAR, SHARED_VAR, TIER_VAR


def start(found, hook, stderr):
    """Judge the node-local folders, make the folders the pieces' tools need (``found``: their
    facts); whether single-flight is on in this process."""
    try:
        _guard(found, hook, stderr)
    except Exception as exc:  # the tier is not used then: nothing unjudged is read
        os.environ[TIER_VAR] = ""
        hook.warn("judging the node-local folders", exc)
    for piece in found:
        for name in piece.makes:
            try:
                _made(piece, name, hook, stderr)
            except Exception as exc:  # that cache is off; the rest of the hook still works
                hook.warn(f"{piece.kind} folder", exc, off=True)
    return _flight(hook, stderr)


def _node_local(folder):
    """Whether ``folder`` is one of gpu-cache's node-local folders
    (``$TMPDIR/gpu-cache-<uid>/<kind>``): made on each node, by whoever comes first, so
    checked on each node (``trust``)."""
    return os.path.basename(os.path.dirname(folder.rstrip(os.sep))) == f"{NODE_LOCAL_PREFIX}{os.getuid()}"


def _made(piece, name, hook, stderr):
    """The folder ``$name``, which the kind's tool makes at start and fails where it cannot
    (Triton, in a read-only image where the cache root is not bound): made here, else ``$name``
    is pointed at a folder the process can use (``trust.unmade``). One stat where it exists."""
    folder = os.environ.get(name)
    if not folder or os.path.isdir(folder):
        return
    try:
        os.makedirs(folder, exist_ok=True)
        return
    except OSError as exc:
        why = exc.strerror or repr(exc)
    from . import trust

    trust.unmade(piece.kind, name, folder, why, hook, stderr)


def _guard(found, hook, stderr):
    """A node-local tier or fallback folder this job was given is judged on this node before
    any tool reads it: ``gpu-cache env`` checked it where it ran, but another user may have
    made it here first (``trust.guard``). The kinds' folders are their pieces' ``node-local``
    facts; the hook's own, the records' (the locks': :func:`_flight`)."""
    tier, shared = os.environ.get(TIER_VAR, ""), os.environ.get(SHARED_VAR, "")
    tier = os.path.normpath(tier) if os.path.isabs(tier) and os.path.isabs(shared) else ""
    declared = [(piece.kind, name) for piece in found for name in piece.node_local]
    declared.append((RECORDS_VAR, RECORDS_VAR))  # (named so in the record's fallbacks)
    folders = [(what, name) for what, name in declared if _node_local(os.environ.get(name) or "")
               and not (tier and os.environ[name].startswith(tier + os.sep))]
    if tier or folders:
        from . import trust

        trust.guard(tier, [piece.kind for piece in found if piece.tier], folders, hook, stderr)


def _flight(hook, stderr):
    """Whether single-flight is on in this process: an absolute ``$GPU_CACHE_LOCKS``, judged on
    this node first where it is node-local (another user who can add files there could hold
    the locks the job waits on)."""
    locks = os.environ.get(LOCKS_VAR)
    if not (locks and os.path.isabs(locks)):
        return False
    if not _node_local(locks):
        return True
    try:
        from . import trust

        return trust.locks_node_local(locks, hook, stderr)
    except Exception as exc:
        hook.warn("single-flight's node-local folder", exc)
        return False
