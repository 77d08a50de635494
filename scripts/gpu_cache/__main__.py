"""``python -m gpu_cache``: the same as the ``gpu-cache`` command."""

from gpu_cache.cli import main

raise SystemExit(main())
