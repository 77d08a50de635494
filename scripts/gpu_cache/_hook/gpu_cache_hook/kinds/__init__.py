"""gpu-cache's startup hook, a piece per cache kind (``gpu_cache_hook``'s docstring lists them).

A piece is ``kinds/<kind>.py`` or ``kinds/<kind>/__init__.py``. Its first line is
``# gpu-cache hook piece``; the comment lines right after it (within its first 1024 bytes)
declare its facts, one a line, which ``sitecustomize`` reads at start without importing it
(``sitecustomize._Piece``); a fact may come on several lines:

- ``watches <module> ...``: its ``on_import(module, hook)`` runs right after each of these
  modules is imported, where the hook watches (records, single-flight or the tier);
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
  serve a process (the record's ``software``).

A piece's module, loaded on first use, calls ``hook.observed(<kind>)`` when its library is
imported (the process then writes a record at exit); ``section(hook)`` is the kind's part of
the record (None: none), and ``device(hook)``, where it has one, what the process compiled for.
"""
