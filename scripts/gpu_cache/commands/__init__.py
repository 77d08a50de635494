"""gpu-cache's subcommands, in pip's way: each ``commands/<name>.py`` owns its arguments
(``add_arguments(parser)``) and its handler (``run(args) -> int``); :mod:`gpu_cache.cli`
imports only the module of the subcommand asked for, builds its parser and dispatches.
What several of them share (settings from the arguments, JSON output) is in
:mod:`gpu_cache.commands.common`.

A new subcommand is a module here and one entry in :data:`COMMANDS`.
"""

from typing import NamedTuple


class Command(NamedTuple):
    """A subcommand: its module, the line ``gpu-cache --help`` shows, and whether it takes the
    arguments every cache command takes (``--cache-root``, ``--config``)."""

    module: str
    summary: str
    common: bool = True


COMMANDS = {
    "env": Command("gpu_cache.commands.env",
                   "print the cache environment as shell lines (eval \"$(gpu-cache env)\")"),
    "warm": Command("gpu_cache.commands.warm", "run the workloads of a GPU type with the cache environment"),
    "validate": Command("gpu_cache.commands.validate", "re-run them in fresh processes and judge the cache"),
    "prune": Command("gpu_cache.commands.prune", "remove broken, old and least recently used entries"),
    "stats": Command("gpu_cache.commands.stats", "entries, bytes, ages and hit rates per kind"),
    "doctor": Command("gpu_cache.commands.doctor", "preflight checks of the cache folders"),
    "summary": Command("gpu_cache.commands.summary", "summarise validation and prune reports", common=False),
    "plots": Command("gpu_cache.commands.plots",
                     "write the report's SVG plots (cold vs warm, cache size, hit rates)"),
    "pack": Command("gpu_cache.commands.pack",
                    "write warmed cache entries into one archive, with a manifest"),
    "unpack": Command("gpu_cache.commands.unpack", "check an archive against this target and add its "
                                                   "entries to the cache; exit 1 when refused"),
    "publish": Command("gpu_cache.commands.publish", "publish the entries a passed validation used to an "
                                                     "OCI registry (one index per image)"),
    "fetch": Command("gpu_cache.commands.fetch", "fetch a GPU type's validated pack from an OCI registry "
                                                 "into the cache, every digest checked (exit 1 when "
                                                 "refused, nothing written)"),
    "install-profile": Command("gpu_cache.commands.install_profile",
                               "install the Snakemake profile (--profile gpu-cache)", common=False),
    "deploy": Command("gpu_cache.commands.deploy", "write a folder that runs the installed package's "
                                                   "workflow (workflow/Snakefile, config/config.yaml)",
                      common=False),
}
