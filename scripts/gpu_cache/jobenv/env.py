"""The cache environment every job gets, and how it is applied without overriding the user.

A variable the user set explicitly wins and is reported. A variable gpu-cache set earlier
in the same process tree (listed in ``GPU_CACHE_MANAGED``) is gpu-cache's own and may be
set again, e.g. when a workflow's config names another cache root than the profile did.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpu_cache.config.settings import Settings
from gpu_cache.core import HOOK_DIR, PACKAGE_PARENT, kinds, names
from gpu_cache.core.kinds import Kind, ReadOnlyUse
from gpu_cache.jobenv import fs, locks, tier, trust
from gpu_cache.jobenv.fs import FolderCheck, check_folder, is_folder, node_local_fallback

#: Folders Apptainer and Singularity bind into every container at the same path: a node-local
#: tier there needs no bind of its own, and gets none, since a bind of a folder that a node
#: lacks (a job on a node where no ``env`` made it yet) stops the container from starting.
DEFAULT_BOUND = (Path("/tmp"), Path("/var/tmp"))


@dataclass
class Exports:
    """The resolved environment.

    ``values`` is what gpu-cache sets; ``kept`` maps each variable the user set to
    ``(their value, the value gpu-cache would have set)``; ``single_flight`` and ``tier`` are
    the plans of :mod:`gpu_cache.jobenv.locks` and :mod:`gpu_cache.jobenv.tier`; ``problems`` says, per cache
    kind, why it runs without its cache or on a node-local fallback; ``adjusted`` says, per
    kind, which setting gpu-cache changed from the config to keep the cache safe; ``checks``
    holds the probe of each kind's folder under the root (kinds the user pointed elsewhere
    are not probed).
    """

    single_flight: locks.LockPlan
    tier: tier.TierPlan
    values: dict[str, str] = field(default_factory=dict)
    kept: dict[str, tuple[str, str]] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)
    adjusted: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    checks: dict[str, FolderCheck] = field(default_factory=dict)
    root_problem: str | None = None
    seeded: bool = False  # a kind reads a read-only root as a seed (its reader is in the hook)
    off: list[str] = field(default_factory=list)  # the kinds that run without their cache

    def messages(self) -> list[str]:
        """One line per thing the user should know, for warnings; a cache root that cannot
        be used at all is one line for every kind."""
        lines = []
        problems = dict(self.problems)
        prefix = f"{self.root_problem}; " if self.root_problem else None
        alike = [kind for kind, why in problems.items() if prefix and why.startswith(prefix)]
        if prefix and alike:  # "jax: <why>; jax runs without ...; triton: using node-local ..."
            first = alike[0]
            lines.append("; ".join([f"{first}: {problems.pop(first)}",
                                    *(f"{kind}: {problems.pop(kind)[len(prefix):]}" for kind in alike[1:])]))
        lines += [f"{kind}: {why}" for kind, why in problems.items()]
        lines += [f"{kind}: {why}" for kind, why in self.adjusted.items()]
        lines += self.warnings
        lines += [f"keeping your {name}={theirs!r} (gpu-cache would set {ours!r})"
                  for name, (theirs, ours) in self.kept.items()]
        return lines

    def as_dict(self) -> dict[str, object]:
        return {
            "exports": dict(self.values),
            "kept": {name: {"yours": t, "gpu_cache": o} for name, (t, o) in self.kept.items()},
            "problems": dict(self.problems),
            "adjusted": dict(self.adjusted),
            "warnings": list(self.warnings),
            "single_flight": self.single_flight.as_dict(),
            "tier": self.tier.as_dict(),
        }


def managed_names(environ: Mapping[str, str]) -> set[str]:
    """Names gpu-cache itself set earlier in this process tree."""
    return {name for name in environ.get(names.MANAGED_VAR, "").split(",") if name}


def _user_set(name: str, environ: Mapping[str, str]) -> bool:
    return name in environ and name not in managed_names(environ)


def check_kind(settings: Settings, kind: Kind) -> FolderCheck:
    """Probe one kind's folder under the (set) cache root, as the settings ask: created
    group-shared in shared-group mode, trusted from the root down, with enough free space;
    and the folders the tool writes into below it (:meth:`Kind.inner`) that exist, each
    trusted like the kind's folder."""
    assert settings.cache_root is not None
    folder = kind.folder(settings.cache_root)
    check = check_folder(folder, team=settings.team, min_free=settings.min_free_space,
                         trusted_above=settings.cache_root, entries=kind.name)
    for inner in kind.inner(folder) if check.problem is None else ():  # a refused folder ends it
        why = trust.distrust(inner, settings.team, settings.cache_root) if is_folder(inner) else None
        if why:
            return replace(check, problem=why)
    return check


@dataclass
class _Placement:
    """Where one kind's cache goes: variables to set, and why it is not the shared folder;
    ``network_fs``: the network filesystem of the root's folder where the kind got that one."""

    values: dict[str, str] = field(default_factory=dict)
    problem: str | None = None
    adjusted: str | None = None
    network_fs: str | None = None
    seeded: bool = False  # it reads the root's folder as a seed, through the startup hook
    off: bool = False  # it runs without its cache (its switch_off)


def hook_problem() -> str | None:
    """Why the startup hook cannot go on jobs' ``PYTHONPATH``, or None. Python splits
    ``PYTHONPATH`` at every ``os.pathsep`` and no quoting escapes it, so a hook folder whose path
    holds one would silently never load (#21); jobs then run without it, which they survive."""
    if os.pathsep not in str(HOOK_DIR):
        return None
    return (f"gpu-cache is installed under {PACKAGE_PARENT}, whose path holds {os.pathsep!r}, which "
            "no PYTHONPATH entry can hold: jobs run without its startup hook (no stats records, no "
            "single-flight, a read-only Triton cache goes node-local); install gpu-cache under a "
            f"path without {os.pathsep!r}")


def with_hook(pythonpath: str | None) -> str:
    """``PYTHONPATH`` with the hook's folder first and the user's value after it as written:
    an empty entry (``/opt/lib:``) means the working folder to Python, so nothing is dropped
    (#21); an empty or unset value adds none."""
    if not pythonpath:
        return str(HOOK_DIR)
    return f"{HOOK_DIR}{os.pathsep}{pythonpath}"


def _unjudged(kind: Kind) -> str | None:
    """Why ``kind``'s folder may not go node-local, or None: another account may make that
    folder first on another node, and the startup hook judges it there before a tool reads it
    only where the kind's piece declares its variable ``node-local``."""
    if kind.env_var in kind.piece.node_local:
        return None
    return f"the startup hook's piece of {kind.name} does not judge {kind.env_var} on each node"


def _place(kind: Kind, root: Path, check: FolderCheck, hook: bool = True) -> _Placement:
    """Decide where ``kind`` caches, from the probe of its folder under ``root``; ``hook``:
    whether the startup hook can load in jobs (the Triton seed reader lives there)."""
    folder = kind.folder(root)
    problem = check.problem
    if problem is None and check.read_only:
        if kind.read_only is ReadOnlyUse.READ:
            pass  # the tool reads it and warns on each failed write
        elif kind.read_only is ReadOnlyUse.SEED and not hook:
            problem = f"{folder} is read-only and its seed reader needs gpu-cache's startup hook"
        elif kind.read_only is ReadOnlyUse.SEED:
            fallback = node_local_fallback(kind.name)
            if not _unjudged(kind) and check_folder(fallback, trusted_above=fallback.parent).problem is None:
                return _Placement(
                    {kind.env_var: str(fallback), **kind.seed_exports(folder)},
                    adjusted=f"{folder} is read-only: its kernels are read as a seed, new ones "
                             f"go to node-local {fallback}", seeded=True)
            problem = f"{folder} is read-only and its node-local fallback failed"
        else:
            problem = f"{folder} is read-only and {kind.name} fails when it cannot write"
    if problem is None:
        return _Placement({kind.env_var: str(folder)}, network_fs=check.fs_type if check.network else None)
    if kind.switch_off is not None:
        name, value = kind.switch_off
        return _Placement({name: value}, problem=f"{problem}; {kind.name} {kind.off_words}", off=True)
    unjudged = _unjudged(kind)
    if unjudged:
        return _Placement(problem=f"{problem}; no node-local fallback: {unjudged}")
    fallback = node_local_fallback(kind.name)
    local = check_folder(fallback, trusted_above=fallback.parent)
    if local.problem is None:
        return _Placement({kind.env_var: str(fallback)},
                          problem=f"{problem}; using node-local {fallback} instead")
    return _Placement(problem=f"{problem}; node-local fallback failed too: {local.problem}")


def root_problem(settings: Settings) -> str | None:
    """Why the cache root cannot be used (:func:`gpu_cache.jobenv.fs.root_check`: doctor's
    words), found without changing anything on disk; None: it can (or caching is off)."""
    if settings.cache_root is None:
        return None
    with fs.diagnosis():
        return fs.root_check(settings.cache_root, settings.team).problem


def root_lines(settings: Settings) -> list[str]:
    """What :func:`export` would warn of a cache root that cannot be used (its reason, and what
    each kind does instead), found without changing anything on disk: a dry run exports nothing,
    and says this instead. None for a usable root."""
    if root_problem(settings) is None:
        return []
    with fs.diagnosis():
        return resolve(settings).messages()[:1]  # (the root's line: every kind's, in one)


def resolve(settings: Settings, environ: Mapping[str, str] | None = None) -> Exports:
    """Work out the exports for ``settings``; probes each cache folder (creates it).

    Never raises for filesystem trouble: an unusable or untrusted folder is reported in
    ``problems`` and that kind runs without a cache (JAX) or on a node-local folder (the
    others, which cannot be switched off). On a network filesystem XLA's extra caches are
    kept off whatever the config says (they fail atomic renames there and crash).
    """
    environ = os.environ if environ is None else environ
    no_hook = hook_problem()
    root = settings.cache_root
    if root is None:
        exports = Exports(locks.off(settings, "caching is turned off"),
                          tier.off(settings, "caching is turned off"),
                          problems={"all": "caching is turned off (cache root 'none')"})
        wanted = {names.ROOT_VAR: names.ROOT_OFF, names.JAX_ENABLE_CACHE_VAR: "false"}
    else:
        exports, wanted = _resolve_root(settings, root, environ, no_hook)
    for name, value in wanted.items():
        if _user_set(name, environ) and environ[name] != value:
            exports.kept[name] = (environ[name], value)
        else:
            exports.values[name] = value
    hook_needed = (settings.stats_hook and root is not None) or exports.seeded \
        or any(kind.needs_hook and exports.values.get(kind.env_var) for kind in kinds.ALL) \
        or bool(exports.values.get(names.LOCKS_VAR)) \
        or bool(exports.values.get(names.TIER_VAR))  # single-flight, tier
    if hook_needed and no_hook:
        exports.warnings.append(no_hook)
    elif hook_needed and str(HOOK_DIR) not in environ.get("PYTHONPATH", "").split(os.pathsep):
        exports.values["PYTHONPATH"] = with_hook(environ.get("PYTHONPATH"))
    if root is not None:  # the package's folder only for the hook (not when it cannot load)
        bound = [root] if no_hook else [root, PACKAGE_PARENT]
        local = exports.tier.local if exports.tier.on else None
        if local is not None and not any(local.is_relative_to(top) for top in DEFAULT_BOUND):
            bound.append(local)  # at the same path inside, like the root
        binds, skipped = container_binds(bound, environ)
        exports.values.update(binds)
        exports.warnings += [f"containers: {path} is not bound into container jobs: a bind path "
                             "cannot hold ',' or ':'" for path in skipped]
    return exports


def _resolve_root(settings: Settings, root: Path, environ: Mapping[str, str], no_hook: str | None
                  ) -> tuple[Exports, dict[str, str]]:
    """The exports of a cache root, before the user's own values are kept: the plans of the
    tier and the locks, each kind's place, and the variables wanted."""
    # A root that cannot be made or trusted fails every kind alike.
    root_check = fs.root_check(root, settings.team)
    user_off = _user_set(names.TIER_VAR, environ) and not environ[names.TIER_VAR]
    tier_plan = tier.plan(settings, root_check, user_off, no_hook)
    lock_plan = locks.plan(settings, root, root_check.problem)
    exports = Exports(lock_plan, tier_plan, warnings=list(tier_plan.warnings),
                      root_problem=root_check.problem)
    wanted = {names.ROOT_VAR: str(root)}
    _place_kinds(settings, root, root_check, environ, no_hook, exports, wanted)
    exports.warnings += lock_plan.warnings
    wanted.update(lock_plan.variables())
    wanted.update(tier_plan.variables())
    if not tier_plan.on and names.TIER_VAR in managed_names(environ):
        wanted[names.TIER_VAR] = ""  # gpu-cache turned it on earlier in this process tree: now off
    return exports, wanted


def _place_kinds(settings: Settings, root: Path, root_check: FolderCheck, environ: Mapping[str, str],
                 no_hook: str | None, exports: Exports, wanted: dict[str, str]) -> None:
    """Each exported kind's folder into ``wanted`` (and its problems and adjustments into
    ``exports``): the tier's, the root's, or a fallback; with the variables that come with it
    (:meth:`Kind.exports`)."""
    local = exports.tier.local if exports.tier.on else None
    for kind in kinds.ALL:
        if not kind.enabled(settings):
            continue
        tiered = local is not None and kind.tiered
        network_fs = None
        if _user_set(kind.env_var, environ):
            wanted[kind.env_var] = str(kind.folder(local if tiered else root))
            tiered = False  # (reported as kept: theirs is used)
        else:
            check = root_check if root_check.problem else check_kind(settings, kind)
            exports.checks[kind.name] = check
            exports.warnings += [f"{kind.name}: {line}" for line in check.warnings]
            tiered = tiered and check.problem is None
            if tiered:
                # The job works node-locally; the hook reads the shared folder on a miss and
                # promotes new entries to it (a read-only one: they stay on this node).
                wanted[kind.env_var] = str(kind.folder(local))
                if check.read_only:  # the tier with promotion off: it stays on this node
                    exports.adjusted[kind.name] = (
                        f"{kind.folder(root)} is read-only: jobs read it on a miss and keep new entries "
                        f"on this node in {kind.folder(local)}")
            else:
                how = _place(kind, root, check, hook=no_hook is None)
                wanted.update(how.values)
                network_fs = how.network_fs
                exports.seeded = exports.seeded or how.seeded
                if how.off:
                    exports.off.append(kind.name)
                if how.problem:
                    exports.problems[kind.name] = how.problem
                if how.adjusted:
                    exports.adjusted[kind.name] = how.adjusted
        if wanted.get(kind.env_var):
            extra = kind.exports(Path(wanted[kind.env_var]), settings, network_fs, tiered)
            wanted.update(extra.values)
            if extra.adjusted:
                exports.adjusted[kind.name] = extra.adjusted


def container_binds(paths: list[Path], environ: Mapping[str, str]) -> tuple[dict[str, str], list[Path]]:
    """``APPTAINER_BIND`` and ``SINGULARITY_BIND`` with the existing ``paths`` added (at the
    same path inside), so that container jobs see the cache root and the startup hook; and
    the paths that cannot be written in a bind list.

    A host's own binds are kept: Apptainer adds ``APPTAINER_BIND`` and ``APPTAINER_BINDPATH``
    up, so a host that sets ``*_BINDPATH`` (with ``os.environ.setdefault``, before or after
    gpu-cache) is untouched, and one that set ``*_BIND`` first gets ours appended. (Apptainer
    ignores ``SINGULARITY_X`` when ``APPTAINER_X`` is set, hence both, with the same value.)
    A host's bind of a path to another place (``<root>:/cache``, ``<root>:/cache:ro``) leaves it
    missing at its own path, where the exported variables point: it gets a second bind there,
    with the same options (#21).
    """
    listable = [p for p in paths if "," not in str(p) and ":" not in str(p)]
    skipped = [p for p in paths if p not in listable]
    usable = [p for p in listable if os.path.isdir(p)]  # Apptainer refuses to bind a missing path
    out = {}
    for name in names.CONTAINER_BIND_VARS:
        entries = [e for e in environ.get(name, "").split(",") if e]
        missing = [_own_path_bind(str(p), entries) for p in usable]
        if any(missing):
            out[name] = ",".join(entries + [bind for bind in missing if bind])
    return out, skipped


def _own_path_bind(path: str, entries: list[str]) -> str | None:
    """The bind that puts ``path`` at its own path in a container, given a bind list's
    ``src[:dst[:options]]`` entries; None when one of them already does."""
    options = None
    for entry in entries:
        source, _, rest = entry.partition(":")
        destination, _, opts = rest.partition(":")
        if os.path.normpath(source) != path:
            continue
        if not destination or os.path.normpath(destination) == path:
            return None
        options = options or opts
    return f"{path}:{path}:{options}" if options else path


def _managed_after(exports: Exports, environ: Mapping[str, str]) -> str:
    """``GPU_CACHE_MANAGED`` once ``exports`` are applied over ``environ``: the names gpu-cache
    set before and now (PYTHONPATH and the bind lists are merged, never owned)."""
    merged = {"PYTHONPATH", *names.CONTAINER_BIND_VARS}
    return ",".join(sorted(managed_names(environ) | (set(exports.values) - merged)))


def apply(exports: Exports, environ: MutableMapping[str, str] | None = None) -> None:
    """Set ``exports.values`` in ``environ`` (default ``os.environ``) and mark them as ours."""
    environ = os.environ if environ is None else environ
    managed = _managed_after(exports, environ)
    environ.update(exports.values)
    environ[names.MANAGED_VAR] = managed


def warn_once(exports: Exports, environ: MutableMapping[str, str] | None = None) -> None:
    """Print the exports' messages to stderr, once per process tree."""
    environ = os.environ if environ is None else environ
    lines = exports.messages()
    if lines and environ.get(names.WARNED_VAR) != "1":
        import logging  # (loaded only when there is something to say)

        log = logging.getLogger(__name__)
        for line in lines:
            log.warning("%s", line)
        environ[names.WARNED_VAR] = "1"


def export(settings: Settings, environ: MutableMapping[str, str] | None = None) -> Exports:
    """Resolve, apply and warn: what the profile and the workflow call at start-up.

    In shared-group mode this also clears the group bits of this process's umask, which
    every job started from it inherits (a umask cannot travel as an environment variable).
    """
    environ = os.environ if environ is None else environ
    if settings.shared_group is not None:
        trust.share_with_group()
    exports = resolve(settings, environ)
    apply(exports, environ)
    warn_once(exports, environ)
    return exports


def shell_lines(exports: Exports) -> str:
    """``export NAME=value`` lines that ``eval "$(gpu-cache env)"`` runs."""
    values = dict(exports.values)
    values[names.MANAGED_VAR] = _managed_after(exports, os.environ)
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in values.items())


def job_environ(exports: Exports, base: Mapping[str, str] | None = None,
                **extra: str) -> dict[str, str]:
    """The environment of a child process: ``base`` (default os.environ) with the exports
    applied, plus ``extra`` variables (e.g. GPU_CACHE_RUN_ID)."""
    environ = dict(os.environ if base is None else base)
    apply(exports, environ)
    environ.update(extra)
    return environ
