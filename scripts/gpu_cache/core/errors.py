"""Errors that reach the user as one line and exit code 2."""


class UsageError(Exception):
    """Bad input from the user: a flag, a config value, a workload name.

    The CLI prints ``gpu-cache: error: <message>`` and exits with code 2. The message
    must say what was wrong and, where it can, how to fix it.
    """
