"""The registry of cache kinds is the one source every module and the startup hook read."""

from __future__ import annotations

import ast

from gpu_cache.config.settings import settings_from
from gpu_cache.core import kinds, software
from gpu_cache.jobenv import env
from helpers import SCRIPTS

HOOK = SCRIPTS / "gpu_cache" / "_hook" / "sitecustomize.py"


def _hook_constant(name: str) -> tuple[str, ...]:
    """A tuple constant of the startup hook, read without running it."""
    tree = ast.parse(HOOK.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise AssertionError(f"{HOOK} defines no {name}")


def test_the_hooks_copies_match_the_registry():
    assert _hook_constant("_WATCHED") == kinds.WATCHED_MODULES
    assert _hook_constant("_KEY_ENV") == kinds.KEY_ENVIRONMENT
    assert _hook_constant("_IMAGE_VARS") == software.IMAGE_VARIABLES
    assert _hook_constant("_KEY_PACKAGES") == software.KEY_PACKAGES


def test_every_kind_gets_its_variable_and_folder(tmp_path):
    exports = env.resolve(settings_from({"bytecode_cache": True}, cache_root=str(tmp_path)), {})
    for kind in (kinds.KINDS[name] for name in kinds.EXPORTED):
        assert exports.values[kind.env_var] == str(tmp_path / kind.name)
        assert (tmp_path / kind.name).is_dir()


def test_inventoried_kinds_are_the_prunable_and_observed_ones():
    assert kinds.PRUNABLE == ("jax", "triton", "inductor", "bytecode", "cuda", "records")
    assert kinds.OBSERVED == ("jax", "triton")
    assert all(kinds.KINDS[name].last_use for name in kinds.PRUNABLE)
