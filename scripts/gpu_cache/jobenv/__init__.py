"""The job environment: the exported variables, the folder and filesystem checks, and the trust rule."""
