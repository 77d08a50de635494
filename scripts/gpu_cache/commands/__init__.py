"""The subcommands' work, one module each (cli.py parses and dispatches)."""
