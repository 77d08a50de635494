"""Built-in workloads: small but real programs that warm and validate a cache."""
