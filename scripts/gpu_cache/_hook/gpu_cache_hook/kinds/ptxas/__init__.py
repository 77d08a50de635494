# gpu-cache hook piece
# start-with GPU_CACHE_PTXAS
# watches-with GPU_CACHE_PTXAS jax_triton
"""gpu-cache's startup hook, the ptxas kind: ``piece`` in a job's process (the shim put first on
its ``PATH``, jaxlib's kernels marked, the calls read into the record); the shim itself
(``bin/ptxas``, then ``shim``, ``identity`` and ``run``), started at every ptxas call. Each ptxas
call imports this package, and only what it runs: what is here only hands a job's process over
to ``piece``."""

_STARTED = []  # the piece, once this process started it


def start(hook):
    """At start, with ``$GPU_CACHE_PTXAS``: the shim first on this process's ``PATH``."""
    from . import piece

    _STARTED.append(piece)
    piece.install(hook)


def on_import(module, hook):
    """Right after ``jax_triton`` is imported: jaxlib's Triton kernels marked for the shim."""
    for piece in _STARTED:
        piece.on_jax_triton(module, hook)


def section(hook):
    """The record's ``ptxas`` part, where the hook started the piece."""
    return _STARTED[0].part(hook) if _STARTED else None
