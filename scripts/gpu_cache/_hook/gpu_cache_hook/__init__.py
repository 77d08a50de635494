"""gpu-cache's startup hook, its package: what ``sitecustomize`` (one folder up, the one file
every Python process of a job loads) loads, from its own folder. ``names`` is the leaf that
everything imports; ``kinds/`` holds a piece per kind, and the rest are the concerns the pieces
share (docs/package.md draws the tree). Standard library only, Python 3.9+; every import
within it is relative (the host imports its rules as ``gpu_cache._hook.gpu_cache_hook``), and
nothing runs at import."""
