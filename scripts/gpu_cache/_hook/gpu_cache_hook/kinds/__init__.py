"""gpu-cache's startup hook, a piece per cache kind: the kind's job side, and its declaration.

A piece is ``kinds/<kind>.py`` or ``kinds/<kind>/__init__.py``, named as its kind. Its first line
is ``# gpu-cache hook piece``; the comment lines right after it (within its first 1024 bytes)
declare the kind's job-side facts, one a line, which the hook's leaf reads without importing the
piece (``names.pieces``): ``sitecustomize`` acts on them in every process, and the host's kind
(``gpu_cache.core.kinds``) reads them rather than declaring them again. A fact may come on several
lines:

- ``watches <module> ...``: its ``on_import(module, hook)`` runs right after each of these
  modules is imported, where the hook watches (records, single-flight or the tier); the host
  counts the kind's hits and misses (validation checks them);
- ``watches-with <VAR> <module> ...``: so too, also where ``$VAR`` is an absolute path;
- ``watches-always <module> ...``: so too, in every process;
- ``start-with <VAR>``: its ``start(hook)`` runs at start where ``$VAR`` is an absolute path;
- ``makes <VAR>``: its tool makes the folder ``$VAR`` names at start and fails where it cannot:
  the hook makes it, or points ``$VAR`` at a folder that can be used (``trust.unmade``);
- ``node-local <VAR>``: where ``$VAR`` names a node-local folder, it is judged on this node
  before any tool reads it (``trust.guard``);
- ``tier <layout> <word> ...``: the kind works in the node-local tier, in ``<tier>/<kind>``, and
  the tier's bound finds its whole entries by ``<layout>`` (``tier.bound.LAYOUTS``);
- ``software <distribution> ...``: the distributions whose versions decide whether its entries
  serve a process (the record's ``software``; the host's key fields);
- ``key-environment <VAR> ...``: variables that change what its tool compiles: each record keeps
  their values, doctor shows them, ``doctor --explain`` compares them, and the outputs proof
  keeps its references apart by them;
- ``place-environment <VAR> ...``: variables that change where its cache is or which devices
  run, in its keys but not in what is computed: kept, shown and compared alike;
- ``cold <VAR>=<value> ...``: what the workload runner's cold pass sets to run the tool without
  any cache (where an empty folder would still serve the pass's own later processes).

A piece's module, loaded on first use, calls ``hook.observed(<kind>)`` when its library is
imported (the process then writes a record at exit); ``section(hook)`` is the kind's part of
the record (None: none), and ``device(hook)``, where it has one, what the process compiled for.
"""
