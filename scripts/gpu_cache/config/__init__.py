"""Configuration: the settings (schema-validated), sizes and ages, and the GPU types."""
