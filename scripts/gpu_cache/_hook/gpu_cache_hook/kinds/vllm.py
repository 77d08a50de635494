# gpu-cache hook piece
# node-local VLLM_CACHE_ROOT
"""gpu-cache's startup hook, vLLM's compile cache root: vLLM reads and writes its folder
(``$VLLM_CACHE_ROOT``) itself, so the hook has nothing to load here. What the kind needs of the
hook is its first lines: where ``gpu-cache env`` gave the job a node-local folder, it is judged
on each node before vLLM reads it (``names.pieces``)."""
