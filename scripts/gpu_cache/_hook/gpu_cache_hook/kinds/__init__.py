"""gpu-cache's startup hook, a piece per cache kind (``gpu_cache_hook``'s docstring lists them).
A kind beyond those ``sitecustomize`` watches is found here by its piece's first line,
``# gpu-cache hook piece watching <module>``: its ``on_import(module, hook)`` runs after that
import, and its ``section(hook)`` is the kind's part of the record."""
