# gpu-cache's package, which holds all the logic the rules call: the one Snakemake's Python
# imports (installed from a release, or `pip install -e` of a checkout), of this workflow's
# version. Never a folder beside this file: served by tag (github(..., tag=...), gitfile(...))
# the workflow is git objects with no package beside them. A missing package, or another
# version, stops the run here, before any job, with one line that says what installs it.

import os
import sys

#: This workflow's release: workflow/VERSION, the one source the package's build reads too.
with open(workflow.source_path("../VERSION")) as gpu_cache_stream:
    GPU_CACHE_VERSION = gpu_cache_stream.read().strip()


def gpu_cache_install_command(source):
    """The pip command that installs the package of the workflow at ``source`` (its folder):
    from its repository at the same tag, from the checkout it lies in, else the release's wheel."""
    if hasattr(source, "host"):  # github(...), gitlab(...)
        return f'pip install "git+https://{source.host}/{source.repo}@{source.ref}"'
    if hasattr(source, "repo_path"):  # gitfile(...)
        return f'pip install "git+file://{os.path.abspath(source.repo_path)}@{source.ref}"'
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(str(source))))
    if os.path.isfile(os.path.join(checkout, "pyproject.toml")):
        return f"pip install -e {checkout}"
    return f"pip install gpu_cache-{GPU_CACHE_VERSION}-py3-none-any.whl (the release's wheel)"


try:
    import gpu_cache

    GPU_CACHE_FOUND = f"{gpu_cache.__version__} (in {os.path.dirname(gpu_cache.__file__)})"
except ImportError:
    GPU_CACHE_FOUND = None
if GPU_CACHE_FOUND is None or gpu_cache.__version__ != GPU_CACHE_VERSION:
    # One line, what it quotes of paths escaped (a newline would split it, ESC drive the terminal).
    sys.exit(
        "".join(
            c if c.isprintable() else c.encode("unicode_escape").decode()
            for c in f"gpu-cache: this workflow is gpu-cache {GPU_CACHE_VERSION} and needs its package of "
            f"that version in Snakemake's Python ({sys.executable}), which has "
            f"{GPU_CACHE_FOUND or 'none'}: {gpu_cache_install_command(workflow.current_basedir)}"
        )
    )
