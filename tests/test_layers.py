"""The package's layers hold (#19): what runs inside job images imports only the standard
library (and core), runs on the oldest Python we support, and no module reaches into
another's private names."""

from __future__ import annotations

import ast
import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import SCRIPTS

PACKAGE = SCRIPTS / "gpu_cache"
#: The job side: run by job images with whatever Python they have.
CORE = PACKAGE / "core"
HOOK = PACKAGE / "_hook"
WORKLOADS = PACKAGE / "workloads"
OLDEST_PYTHON = "3.9"


def imports(path: Path) -> list[tuple[int, str, bool]]:
    """(line, module, optional) for each import in ``path``; optional: inside a ``try`` that
    catches ImportError (the module is used where it is installed)."""
    tree = ast.parse(path.read_text())
    optional: set[int] = set()
    guards = ("ImportError", "ModuleNotFoundError", "Exception")  # Exception: it may fail otherwise too
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id in guards for h in node.handlers):
            optional |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, id(node) in optional) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module, id(node) in optional))
    return found


def stdlib(module: str) -> bool:
    return module.split(".")[0] in sys.stdlib_module_names


def test_core_imports_only_the_standard_library_core_and_the_hook():
    """Core imports the standard library, core, and the startup hook's rules (the hook is the
    lowest layer: standard library only, it imports nothing of the package)."""
    wrong = [f"{path.relative_to(SCRIPTS)}:{line}: {module}"
             for path in sorted(CORE.rglob("*.py"))
             for line, module, optional in imports(path)
             if not (stdlib(module) or optional
                     or module.split(".")[:2] in (["gpu_cache", "core"], ["gpu_cache", "_hook"]))]
    assert wrong == []


def module_imports(path: Path) -> list[tuple[str, int]]:
    """(module, level) of each import at the top level of ``path`` (what importing it runs)."""
    found = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found += [(alias.name, 0) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.module or "", node.level))
    return found


def test_what_the_host_imports_of_the_hook_imports_only_the_standard_library():
    """A hook module the host side imports (its one home of a rule: the names, the digest frame,
    the owner and lock rules, the seal reader) runs under the package's name, where neither
    ``sitecustomize`` nor ``gpu_cache_hook`` is the hook's: it imports the standard library and,
    relatively, such modules alone."""
    used = {module for path in PACKAGE.rglob("*.py") if HOOK not in path.parents
            for _line, module, _optional in imports(path) if module.startswith("gpu_cache._hook.")}
    assert used, "the host imports nothing of the hook"
    wrong = []
    for module in sorted(used):
        path = SCRIPTS.joinpath(*module.split(".")).with_suffix(".py")
        if not path.is_file():  # a package: importing it runs its __init__
            path = path.with_suffix("") / "__init__.py"
        wrong += [f"{module}: {name}" for name, level in module_imports(path) if not (stdlib(name) or level)]
    assert wrong == []


def test_the_hook_and_the_workloads_import_nothing_of_the_host_side():
    wrong = [f"{path.relative_to(SCRIPTS)}:{line}: {module}"
             for folder in (HOOK, WORKLOADS) for path in sorted(folder.rglob("*.py"))
             for line, module, _optional in imports(path)
             if module.split(".")[0] == "gpu_cache" and not module.startswith(("gpu_cache.core",
                                                                               "gpu_cache.workloads"))]
    wrong += [f"{path.relative_to(SCRIPTS)}:{line}: {module}"  # the hook runs without the package
              for path in sorted(HOOK.rglob("*.py"))
              for line, module, _optional in imports(path) if module.split(".")[0] == "gpu_cache"]
    assert wrong == []


def private_uses(path: Path) -> list[str]:
    """Private names (``_x``) of gpu_cache modules that ``path`` imports or reads."""
    tree = ast.parse(path.read_text())
    modules: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gpu_cache"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{path.name}:{node.lineno}: {node.module}.{alias.name}")
                modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            modules |= {(a.asname or a.name).split(".")[0] for a in node.names
                        if a.name.startswith("gpu_cache")}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_module_reaches_into_another_modules_private_names():
    tests = Path(__file__).parent
    files = [*PACKAGE.rglob("*.py"), *tests.glob("*.py"), *(tests / "harness").glob("*.py"),
             *(tests / "benchmarks").glob("*.py")]
    assert [use for path in sorted(files) for use in private_uses(path)] == []


def oldest_python() -> str | None:
    """pyenv's (its shim on PATH answers only for the active version), else one on PATH."""
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = sorted(glob.glob(f"{pyenv}/versions/{OLDEST_PYTHON}.*/bin/python{OLDEST_PYTHON}"))
    return candidates[-1] if candidates else shutil.which(f"python{OLDEST_PYTHON}")


def the_oldest_python() -> str:
    python = oldest_python()
    if python is None:
        message = f"no Python {OLDEST_PYTHON} here (pyenv has one on this kind of machine)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return python


def job_side_files(scripts: Path) -> list[Path]:
    """Every Python file the job side runs: core, the whole hook package (not only its top
    folder: its pieces are nested) and the workloads."""
    package = scripts / "gpu_cache"
    return sorted(p for folder in ("core", "_hook", "workloads") for p in (package / folder).rglob("*.py"))


def not_compiled_by(python: str, files: list[Path]) -> list[str]:
    """The lines ``python`` prints for each of ``files`` whose source it cannot compile."""
    program = ("import sys\n"
               "for path in sys.argv[1:]:\n"
               "    try:\n"
               "        with open(path) as source:\n"
               "            compile(source.read(), path, 'exec')\n"
               "    except SyntaxError as exc:\n"
               "        print(f'{path}:{exc.lineno}: {exc.msg}')\n")
    done = subprocess.run([python, "-c", program, *map(str, files)], capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], "PYTHONDONTWRITEBYTECODE": "1"})
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_job_side_runs_on_the_oldest_python_we_support():
    python = the_oldest_python()
    assert not_compiled_by(python, job_side_files(SCRIPTS)) == []
    core = sorted(".".join(p.relative_to(SCRIPTS).with_suffix("").parts) for p in CORE.rglob("*.py"))
    program = ("import importlib\n"
               f"for name in {[m.removesuffix('.__init__') for m in core]!r}:\n"
               "    importlib.import_module(name)\n")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(SCRIPTS), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([python, "-c", program], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    runner = subprocess.run([python, "-m", "gpu_cache.core.runner", "--help"], env=env,
                            capture_output=True, text=True)
    assert runner.returncode == 0 and "usage" in runner.stdout, runner.stderr


def test_the_oldest_python_check_finds_a_newer_line_in_any_hook_module(tmp_path):
    """A copy of the package where one hook module deep in the package has a ``match``
    statement (Python 3.10): the check names that module. Guard: job_side_files walks the
    whole hook package."""
    python = the_oldest_python()
    copy = tmp_path / "scripts"
    shutil.copytree(SCRIPTS / "gpu_cache", copy / "gpu_cache", ignore=shutil.ignore_patterns("__pycache__"))
    deep = copy / "gpu_cache" / "_hook" / "gpu_cache_hook" / "tier" / "bound.py"
    deep.write_text(deep.read_text() + "\n\ndef newer(value):\n    match value:\n        case _:\n"
                    "            return value\n")
    assert [line.partition(":")[0] for line in not_compiled_by(python, job_side_files(copy))] == [str(deep)]


def import_graph(top: Path) -> dict[str, set[str]]:
    """Which modules under ``top`` each module there imports, wherever in it (a deferred import
    in a function counts: it is a circle all the same, worked around), relative imports
    resolved, except under ``if TYPE_CHECKING:`` (annotations only). Modules are named from
    ``top``'s parent (core: ``gpu_cache.core...``), or from ``top`` itself for the hook, whose
    folder is the jobs' ``sys.path`` entry (``sitecustomize``, ``gpu_cache_hook...``). A
    submodule's own package is not counted as an import of it (a registry's ``__init__`` that
    imports its modules is no circle)."""
    base = top if top == HOOK else SCRIPTS
    modules = {".".join(p.relative_to(base).with_suffix("").parts).removesuffix(".__init__"): p
               for p in top.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"
                       for stmt in node.body for n in ast.walk(stmt)}
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names if alias.name in modules}
            elif isinstance(node, ast.ImportFrom):
                origin = node.module or ""
                if node.level:
                    parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                    origin = ".".join([*parent, *([origin] if origin else [])])
                subs = {f"{origin}.{alias.name}" for alias in node.names} & set(modules)
                found |= subs
                found |= {origin} if origin in modules and len(subs) < len(node.names) else set()
        graph[name] = found - {name}
    return graph


def circles_of(graph: dict[str, set[str]]) -> list[str]:
    """Each way a module of ``graph`` comes back to itself through the modules it imports."""
    circles = []
    for start in graph:
        stack, seen = [(start, [start])], set()
        while stack:
            here, path = stack.pop()
            for nxt in graph[here]:
                if nxt == start:
                    circles.append(" -> ".join([*path, start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    return circles


def test_core_has_no_import_circle():
    """No module of core imports, however late, a module that imports it back (the record
    readers are a leaf; a kind's logic is in its kind)."""
    assert circles_of(import_graph(CORE)) == []


#: The one circle the hook keeps: the ptxas shim's modules, a program of their own that each
#: ptxas call starts (``shim`` imports ``identity`` and ``run`` in the calls that need them).
SHIM_CIRCLE = {"gpu_cache_hook.kinds.ptxas.shim", "gpu_cache_hook.kinds.ptxas.identity",
               "gpu_cache_hook.kinds.ptxas.run"}


def test_the_hook_has_no_import_circle_but_the_ptxas_shims_and_sitecustomize_is_its_top():
    """Every arrow of the hook runs down: no module imports, however late, one that imports it
    back (but the shim's own three), and nothing imports ``sitecustomize``, the top floor (its
    names were the hook's: 5 arrows ran back up to it, through a 9-module circle)."""
    graph = import_graph(HOOK)
    assert {name for name, imported in graph.items() if "sitecustomize" in imported} == set()
    assert [c for c in circles_of(graph) if not set(c.split(" -> ")) <= SHIM_CIRCLE] == []
    assert {"gpu_cache_hook.names", "gpu_cache_hook.start"} <= graph["sitecustomize"]
    assert graph["gpu_cache_hook.names"] == set()  # the leaf


def test_the_hooks_own_imports_are_relative():
    """The hook's package imports its own modules relatively: it runs as ``gpu_cache_hook`` in
    jobs and as ``gpu_cache._hook.gpu_cache_hook`` where the host imports its rules, its names,
    its facts and its pieces' formats, and never finds another checkout's modules on the path."""
    package = sorted((HOOK / "gpu_cache_hook").rglob("*.py"))
    wrong = [f"{path.relative_to(HOOK)}:{line}: {module}" for path in package
             for line, module, _optional in imports(path)
             if module.split(".")[0] in ("gpu_cache_hook", "sitecustomize")]
    assert wrong == []


#: The host side's layers, lowest first: each imports only from the layers below it (and
#: itself). (``core`` and the hook are held above; ``workloads`` run in jobs, beside core.)
HOST_LAYERS = (("core",), ("config",), ("jobenv", "reports"), ("carry", "oci"), ("commands", "profile"),
               ("cli",))


def layer_of(module: str) -> int | None:
    part = module.split(".")[1] if module.startswith("gpu_cache.") else None
    return next((n for n, names in enumerate(HOST_LAYERS) if part in names), None)


def test_each_host_layer_imports_only_the_layers_below_it():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        own = layer_of(".".join(path.relative_to(SCRIPTS).with_suffix("").parts))
        if own is None:
            continue
        wrong += [f"{path.relative_to(SCRIPTS)}:{line}: {module}" for line, module, _optional in imports(path)
                  if (layer_of(module) or 0) > own]
    assert wrong == []


#: The longest a module and a function of the package and of its tests may be: past that, one
#: holds several concerns.
MODULE_LINES, FUNCTION_LINES = 600, 80
#: The tests' own Python, which keeps the caps: everything under tests/ but the kept fixtures
#: (tests/fixtures: copies of other projects' files and of earlier hooks, kept as they were).
TESTS = SCRIPTS.parent / "tests"
KEPT_FIXTURES = TESTS / "fixtures"


def over_the_caps(paths: list[Path]) -> tuple[dict[str, int], dict[str, int]]:
    """The modules among ``paths`` over :data:`MODULE_LINES` and their functions over
    :data:`FUNCTION_LINES`, with their lengths."""
    long_modules, long_functions = {}, {}
    for path in paths:
        text = path.read_text()
        where = str(path.relative_to(SCRIPTS.parent))
        if len(text.splitlines()) > MODULE_LINES:
            long_modules[where] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > FUNCTION_LINES:
                    long_functions[f"{where}:{node.lineno} {node.name}"] = length
    return long_modules, long_functions


def test_no_module_is_over_600_lines_and_no_function_over_80():
    assert over_the_caps(sorted(PACKAGE.rglob("*.py"))) == ({}, {})


def test_no_test_module_is_over_600_lines_and_no_function_over_80():
    """The tests split by concern before the cap, as the package does (a file that holds
    several concerns grows until no one reads it whole)."""
    paths = sorted(p for p in TESTS.rglob("*.py") if not p.is_relative_to(KEPT_FIXTURES))
    assert len(paths) > 100 and any(p.parent.name == "harness" for p in paths)
    assert over_the_caps(paths) == ({}, {})
