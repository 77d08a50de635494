# gpu-cache hook piece
# node-local CUDA_CACHE_PATH
# place-environment CUDA_VISIBLE_DEVICES
# cold CUDA_CACHE_DISABLE=1
"""gpu-cache's startup hook, the CUDA driver's cache: the driver reads and writes its folder
(``$CUDA_CACHE_PATH``) itself and checks it itself, so the hook has nothing to load here. What
the kind needs of the hook is its first lines: where ``gpu-cache env`` gave the job a node-local
folder, it is judged on each node before the driver reads it (``names.pieces``)."""
