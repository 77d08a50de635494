"""Built-in workloads that gpu-cache runs to warm and validate compile caches."""
