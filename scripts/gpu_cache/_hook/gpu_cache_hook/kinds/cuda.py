# gpu-cache hook piece
# node-local CUDA_CACHE_PATH
"""gpu-cache's startup hook, the CUDA driver's cache: the driver reads and writes its folder
(``$CUDA_CACHE_PATH``) itself and checks it itself, so the hook has nothing to load here. What
the kind needs of the hook is its first lines: where ``gpu-cache env`` gave the job a node-local
folder, it is judged on each node before the driver reads it (``sitecustomize._Piece``)."""
