"""gpu-cache's startup hook, the ptxas kind: ``piece`` in a job's process (the shim put first on
its ``PATH``, jaxlib's kernels marked, the calls read into the record); the shim itself
(``bin/ptxas``, then ``shim``, ``identity`` and ``run``), started at every ptxas call. Empty:
each ptxas call imports this package, and only what it runs."""
