"""gpu-cache's startup hook, its pieces: what ``sitecustomize`` (one folder up, the one file
every Python process of a job loads) loads when a process needs it. Standard library only,
Python 3.9+; nothing here imports the ``gpu_cache`` package, and nothing runs at import.

By kind, in ``kinds/`` (one module, or one package where a kind has helpers; its docstring
says when it is loaded):

- ``kinds.jax`` (``cache``), ``kinds.triton`` (its cache managers: ``seed``, ``tier_manager``;
  ``no_torch``), ``kinds.inductor`` (``flight``), ``kinds.jax_triton`` (``store``,
  ``functions``), ``kinds.ptxas`` (``piece``; the shim: ``bin/ptxas``, ``shim``, ``identity``, ``run``),
  ``kinds.tokamax`` (the autotune kind and tokamax's fix), ``kinds.bytecode``,
  ``kinds.torch_extensions`` (``flags``), ``kinds.numba``; ``kinds.cuda`` and ``kinds.vllm``
  (their first lines only). Each piece declares its facts in its first lines, where
  ``sitecustomize`` finds it (``sitecustomize._Piece``): a new kind's piece needs no line
  elsewhere.

By shared concern:

- ``tier`` (the node-local tier: ``bound``, ``files``, ``set_aside``, ``seals``);
- ``flight`` (single-flight: ``leases``) and ``locks`` (the lock rules of both);
- ``records`` (the JSON record a process writes at exit: each loaded piece's section);
- ``trust`` (the node-local folders judged on each node) and ``digest`` (the digest frame of
  the entries the hook serves itself);
- ``common`` (what the pieces share: limits, the owner rules, the ways to flight and tier).

None of these names a kind: they loop over the facts the pieces declare.
"""
