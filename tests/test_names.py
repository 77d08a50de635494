"""The job environment's names have one home each (#33, #48): the names the startup hook uses
live in its ``sitecustomize.py`` (the hook cannot import the package), and
``gpu_cache.core.names`` imports them from there beside the host's own; the rest of the package
takes every name from ``core.names``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from gpu_cache.core import names
from helpers import HOOK, SCRIPTS

PACKAGE = SCRIPTS / "gpu_cache"
NAMES = PACKAGE / "core" / "names.py"
HOOK_NAMES = HOOK / "sitecustomize.py"
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


def test_the_hooks_pieces_take_their_names_from_sitecustomize():
    hooks = constants(HOOK_NAMES)
    missing = [f"{path.name}: {alias.name}" for path in sorted(HOOK.rglob("*.py"))
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.ImportFrom) and node.module == "sitecustomize"
               for alias in node.names if alias.name not in hooks]
    assert missing == []


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
    which explain, and comments left out)."""
    tree = ast.parse(path.read_text())
    skip = _docstrings(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and id(node) not in skip and isinstance(node.value, (str, bytes)):
            text = node.value if isinstance(node.value, str) else node.value.decode("latin-1")
            found |= set(VARIABLE.findall(text))
    return found


def test_each_variable_name_is_written_in_one_host_module_and_one_hook_module():
    where: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for name in written_names(path):
            where.setdefault(name, set()).add(str(path.relative_to(PACKAGE)))
    home = {str(NAMES.relative_to(PACKAGE)), str(HOOK_NAMES.relative_to(PACKAGE))}
    assert {name: sorted(places - home) for name, places in where.items() if places - home} == {}
    assert where, "no GPU_CACHE_ name found at all: the check reads nothing"
