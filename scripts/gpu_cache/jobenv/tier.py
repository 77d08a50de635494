"""The node-local tier's host side (issue 23): where a cache root's local tier is on every
node, whether jobs get it (:func:`plan`, which ``env.resolve`` combines with the rest), and
whether the tier this node holds may be read (``pack``, ``prune``; :func:`on_this_node`).

The tier's folder is ``<base>/<16 hex of sha256(root)>``: ``base`` is ``local_tier.folder``,
else ``/tmp/gpu-cache-<uid>/tier`` (a fixed path on every node, never ``$TMPDIR``, which a
batch system may make per job: jax <= 0.10 hashes the path of XLA's autotune folder into
every key). Its folders are judged by the trust rule (:mod:`gpu_cache.jobenv.trust`) from
:attr:`Location.trusted_above` down: the configured base, or ``/tmp/gpu-cache-<uid>``
(``/tmp`` itself is world-writable and sticky). The job side of the tier is the startup
hook's (``_hook/gpu_cache_hook/tier/__init__.py``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpu_cache.config.settings import Settings
from gpu_cache.core import kinds, names
from gpu_cache.jobenv import trust
from gpu_cache.jobenv.fs import FolderCheck, check_folder


@dataclass(frozen=True)
class Location:
    """Where a cache root's tier is on a node: its folder and the folder from which down its
    folders must be trusted."""

    folder: Path
    trusted_above: Path


def location(settings: Settings) -> Location | None:
    """Where this cache root's tier is on a node (None with caching off)."""
    if settings.cache_root is None:
        return None
    configured = settings.local_tier.folder
    if configured:
        base = Path(os.path.abspath(os.path.expandvars(os.path.expanduser(configured))))
        above = base
    else:
        base = Path("/tmp") / names.node_local_name(os.getuid()) / names.TIER_FOLDER
        above = base.parent
    return Location(base / kinds.tier_name(settings.cache_root), above)


@dataclass(frozen=True)
class NodeTier:
    """The tier this node holds for the cache root: its folder, and why it may not be read
    (None: it may; another user's folder there could hold anyone's entries)."""

    folder: Path
    problem: str | None


def on_this_node(settings: Settings) -> NodeTier | None:
    """The tier this node holds for the cache root, judged; None where it has none."""
    where = location(settings)
    if where is None or not where.folder.is_dir():
        return None
    return NodeTier(where.folder, trust.distrust(where.folder, settings.team, where.trusted_above))


@dataclass(frozen=True)
class TierPlan:
    """Whether jobs work in the node-local tier, where, and why (what doctor and ``env
    --json`` show): ``problem`` says why a tier that was wanted is off; ``fs_type`` and
    ``free_bytes`` are the probe of its folder, where it was probed."""

    on: bool
    mode: names.TierMode
    local: Path | None
    max_bytes: int
    why: str
    shared: Path | None = None
    problem: str | None = None
    fs_type: str | None = None
    free_bytes: int | None = None
    warnings: tuple[str, ...] = field(default=(), compare=False)

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "on": self.on, "mode": self.mode, "local": None if self.local is None else str(self.local),
            "shared": None if self.shared is None else str(self.shared), "max_bytes": self.max_bytes,
            "why": self.why, "problem": self.problem}
        if self.fs_type is not None:
            out.update(fs_type=self.fs_type, free_bytes=self.free_bytes)
        return out

    def variables(self) -> dict[str, str]:
        """What the startup hook reads in jobs (none with the tier off)."""
        if not self.on:
            return {}
        return {names.TIER_VAR: str(self.local), names.SHARED_VAR: str(self.shared),
                names.TIER_MAX_BYTES_VAR: str(self.max_bytes)}


def off(settings: Settings, why: str) -> TierPlan:
    """No tier: caching is off."""
    return TierPlan(False, settings.local_tier.mode, None, settings.local_tier.max_size, why)


def plan(settings: Settings, root_check: FolderCheck, user_off: bool, no_hook: str | None) -> TierPlan:
    """Whether the tier is on for these settings (the cache root probed as ``root_check``;
    ``user_off``: the jobs' environment sets ``GPU_CACHE_TIER=''`` itself; ``no_hook``: why the
    startup hook cannot load). A tier that is wanted but whose folder cannot be used is off, with
    one warning line, and jobs use the cache root as without it."""
    mode = settings.local_tier.mode
    where = location(settings)
    assert where is not None and settings.cache_root is not None
    plain = TierPlan(False, mode, where.folder, settings.local_tier.max_size, why="")
    fs = f"the cache root is on {root_check.fs_type}"
    if user_off:
        return replace(plain, why=f"turned off for these jobs by {names.TIER_VAR}='' in the environment")
    if root_check.problem:
        return replace(plain, why="the cache root cannot be used")
    if mode == "off":
        return replace(plain, why="local_tier.mode: off")
    if mode == "auto" and not root_check.network:
        fuse = " (a FUSE filesystem: set local_tier.mode: on if it is remote)" \
            if root_check.family == "fuse" else ", local to this node"
        return replace(plain, why=f"{fs}{fuse} (local_tier.mode: auto)")
    why = "local_tier.mode: on" if mode == "on" else f"{fs}, a network filesystem (local_tier.mode: auto)"
    if no_hook:
        problem, check = "its reads and promotions need gpu-cache's startup hook, which cannot load", None
    else:
        problem, check = _check_folders(settings, where)
    wanted = replace(plain, why=why)
    if check is not None:
        wanted = replace(wanted, fs_type=check.fs_type, free_bytes=check.free_bytes)
    if problem:
        return replace(wanted, problem=problem, warnings=(
            f"local tier: {problem}; it is off, and jobs read and write the cache root "
            f"{settings.cache_root} directly",))
    return replace(wanted, on=True, shared=settings.cache_root,
                   warnings=tuple(f"local tier: {line}" for line in check.warnings) if check else ())


def _check_folders(settings: Settings, where: Location) -> tuple[str | None, FolderCheck | None]:
    """Why the tier's folders cannot be used (None: they can), and the probe of the tier's own
    folder (None where the folder that holds it failed: nothing is made in one not trusted)."""
    local = where.folder
    above = check_folder(local.parent, create=False, team=settings.team, min_free=0,
                         probe=False, trusted_above=where.trusted_above)
    if above.problem:
        return above.problem, None
    check = check_folder(local, team=settings.team, min_free=settings.min_free_space,
                         trusted_above=where.trusted_above, private=True)
    problem = check.problem or (f"{local} is read-only" if check.read_only else None)
    for kind in (k for k in kinds.ALL if k.tiered) if problem is None else ():
        problem = check_folder(kind.folder(local), team=settings.team,
                               min_free=0, trusted_above=local, probe=False, private=True).problem
        if problem:
            break
    return problem, check
