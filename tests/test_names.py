"""The job environment's names have one home each (#33, #48): the names the startup hook uses
live in its leaf, ``gpu_cache_hook/names.py`` (the hook cannot import the package), and
``gpu_cache.core.names`` imports them from there beside the host's own; the rest of the package
takes every name from ``core.names``. Nothing takes a name from ``sitecustomize``, a module name
that is not ours (Debian's Python has one of its own)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from gpu_cache.core import names
from helpers import HOOK, SCRIPTS

PACKAGE = SCRIPTS / "gpu_cache"
NAMES = PACKAGE / "core" / "names.py"
HOOK_NAMES = HOOK / "gpu_cache_hook" / "names.py"
VARIABLE = re.compile(r"\bGPU_CACHE_[A-Z][A-Z0-9_]*")


def constants(path: Path) -> dict[str, object]:
    """The module-level ``NAME = <literal>`` assignments of ``path`` whose name is public."""
    found = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and not target.id.startswith("_"):
                    try:
                        found[target.id] = ast.literal_eval(node.value)
                    except ValueError:
                        pass
    return found


def test_core_names_holds_each_of_the_hooks_names():
    hooks = constants(HOOK_NAMES)
    assert hooks, f"{HOOK_NAMES} holds no names"
    differ = {name: (value, getattr(names, name, "(not in core.names)")) for name, value in hooks.items()
              if getattr(names, name, None) != value}
    assert differ == {}


def test_the_hooks_modules_take_their_names_from_the_leaf_and_none_from_sitecustomize():
    """Each name a hook module imports from the leaf is one the leaf holds, and no module of the
    package, of the tests or of their harness imports ``sitecustomize`` (a piece's ``from
    sitecustomize import`` found Debian's own module in a venv of Debian's python3)."""
    hooks = {*constants(HOOK_NAMES), *(node.name for node in ast.parse(HOOK_NAMES.read_text()).body
                                       if isinstance(node, (ast.FunctionDef, ast.ClassDef)))}
    missing, site = [], []
    tests = Path(__file__).parent
    for path in sorted([*PACKAGE.rglob("*.py"), *tests.rglob("*.py")]):
        if "fixtures" in path.relative_to(tests if tests in path.parents else PACKAGE).parts:
            continue  # (older hooks, kept as they were)
        for node in ast.walk(ast.parse(path.read_text())):
            leaf = isinstance(node, ast.ImportFrom) and node.level and node.module == "names"
            if leaf and HOOK in path.parents:
                missing += [f"{path.name}: {alias.name}" for alias in node.names if alias.name not in hooks]
            named = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            site += [f"{path}:{node.lineno}" for name in named if name.split(".")[-1] == "sitecustomize"]
    assert (missing, site) == ([], [])


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of a module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            found.add(id(body[0].value))
    return found


def written_names(path: Path) -> set[str]:
    """The ``GPU_CACHE_*`` names that the code of ``path`` writes in its strings (docstrings,
    which explain, comments, and bytes searched for in files, the signs of older hooks, left
    out)."""
    tree = ast.parse(path.read_text())
    skip = _docstrings(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and id(node) not in skip and isinstance(node.value, str):
            found |= set(VARIABLE.findall(node.value))
    return found


def test_each_variable_name_is_written_in_one_host_module_and_one_hook_module():
    where: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for name in written_names(path):
            where.setdefault(name, set()).add(str(path.relative_to(PACKAGE)))
    home = {str(NAMES.relative_to(PACKAGE)), str(HOOK_NAMES.relative_to(PACKAGE))}
    assert {name: sorted(places - home) for name, places in where.items() if places - home} == {}
    assert where, "no GPU_CACHE_ name found at all: the check reads nothing"
