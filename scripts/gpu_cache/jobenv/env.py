"""The cache environment every job gets, and how it is applied without overriding the user.

A variable the user set explicitly wins and is reported. A variable gpu-cache set earlier
in the same process tree (listed in ``GPU_CACHE_MANAGED``) is gpu-cache's own and may be
set again, e.g. when a workflow's config names another cache root than the profile did.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import tempfile
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path

from gpu_cache.config.settings import Settings
from gpu_cache.core import HOOK_DIR, PACKAGE_PARENT, kinds
from gpu_cache.core.kinds import CacheKind, ReadOnlyUse
from gpu_cache.jobenv import trust
from gpu_cache.jobenv.fs import FolderCheck, check_folder, flock_problem, lease_problem

#: Bind lists of container runtimes, in the variables gpu-cache extends (see container_binds).
CONTAINER_BIND_VARS = ("APPTAINER_BIND", "SINGULARITY_BIND")
#: Folders Apptainer and Singularity bind into every container at the same path: a node-local
#: tier there needs no bind of its own, and gets none, since a bind of a folder that a node
#: lacks (a job on a node where no ``env`` made it yet) stops the container from starting.
DEFAULT_BOUND = (Path("/tmp"), Path("/var/tmp"))
#: Triton cache manager (in HOOK_DIR) that reads a read-only seed cache and writes node-locally.
SEED_MANAGER = "gpu_cache_triton_seed:SeedOverlayCacheManager"
SEED_VAR = "GPU_CACHE_TRITON_SEED"
MANAGED_VAR = "GPU_CACHE_MANAGED"
WARNED_VAR = "GPU_CACHE_WARNED"
#: Single-flight (the startup hook's gpu_cache_flight): the lock folder (empty: off), how
#: long a waiter waits, in seconds, and its mode: "node" (flock) or "cluster" (flock within a
#: node, a lease per key across the nodes that share the folder).
LOCKS_VAR = "GPU_CACHE_LOCKS"
LOCK_TIMEOUT_VAR = "GPU_CACHE_LOCK_TIMEOUT"
LOCK_MODE_VAR = "GPU_CACHE_LOCK_MODE"
#: The lock folder under the cache root: not a cache kind (nothing counts or prunes it).
LOCKS_FOLDER = "locks"
#: The node-local tier (issue 23; the startup hook's gpu_cache_tier): this root's local folder
#: (empty: no tier in this process), the cache root it maps to, and the local bound in bytes.
TIER_VAR = "GPU_CACHE_TIER"
SHARED_VAR = "GPU_CACHE_SHARED"
TIER_MAX_VAR = "GPU_CACHE_TIER_MAX_BYTES"
#: XLA's per-fusion autotune results: kept with the tier on (in the local folder, where the
#: rename that fails on BeeGFS is local), off on a network filesystem without it.
TIER_XLA_CACHES = "xla_gpu_per_fusion_autotune_cache_dir"


@dataclass
class Exports:
    """The resolved environment.

    ``values`` is what gpu-cache sets; ``kept`` maps each variable the user set to
    ``(their value, the value gpu-cache would have set)``; ``problems`` says, per cache
    kind, why it runs without its cache or on a node-local fallback; ``adjusted`` says, per
    kind, which setting gpu-cache changed from the config to keep the cache safe; ``checks``
    holds the probe of each kind's folder under the root (kinds the user pointed elsewhere
    are not probed).
    """

    values: dict[str, str] = field(default_factory=dict)
    kept: dict[str, tuple[str, str]] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)
    adjusted: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    checks: dict[str, FolderCheck] = field(default_factory=dict)
    root_problem: str | None = None
    single_flight: dict[str, object] = field(default_factory=dict)
    tier: dict[str, object] = field(default_factory=dict)

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
            "single_flight": dict(self.single_flight),
            "tier": dict(self.tier),
        }


def managed_names(environ: Mapping[str, str]) -> set[str]:
    """Names gpu-cache itself set earlier in this process tree."""
    return {name for name in environ.get(MANAGED_VAR, "").split(",") if name}


def _user_set(name: str, environ: Mapping[str, str]) -> bool:
    return name in environ and name not in managed_names(environ)


def node_local_fallback(kind: str) -> Path:
    """A per-user folder on local disk for a kind whose shared folder cannot be used."""
    return Path(tempfile.gettempdir()) / f"gpu-cache-{os.getuid()}" / kind


def tier_base(settings: Settings) -> Path:
    """The folder that holds each root's node-local tier: ``local_tier.folder`` (``~`` and
    ``$VARS`` expanded), else ``/tmp/gpu-cache-<uid>/tier``: a fixed path on every node, never
    ``$TMPDIR``, which a batch system may make per job (jax <= 0.10 hashes the path of XLA's
    autotune folder into every key)."""
    configured = settings.local_tier.folder
    if configured:
        return Path(os.path.abspath(os.path.expandvars(os.path.expanduser(configured))))
    return Path("/tmp") / f"gpu-cache-{os.getuid()}" / "tier"


def tier_folder(settings: Settings) -> Path | None:
    """This cache root's node-local tier: ``<tier_base>/<16 hex of sha256(root)>``, so that two
    roots never share one; None with caching off."""
    if settings.cache_root is None:
        return None
    return tier_base(settings) / tier_digest(settings.cache_root)


def tier_digest(root: Path | str) -> str:
    """The name of the cache root ``root``'s folder in any node-local tier base."""
    return hashlib.sha256(os.fsencode(os.path.normpath(root))).hexdigest()[:16]


def in_tier_of(folder: str, root: Path | str) -> bool:
    """Whether ``folder`` is a tiered kind's folder in a node-local tier of ``root``
    (``<any tier base>/<tier_digest(root)>/<kind>``): a job's cache folder that is the root's."""
    path = Path(os.path.normpath(folder))
    return path.name in kinds.TIERED and path.parent.name == tier_digest(root)


def tier_trusted_above(settings: Settings) -> Path:
    """From where down the tier's folders must be trusted: the configured folder, or the
    per-user ``/tmp/gpu-cache-<uid>`` (``/tmp`` itself is world-writable and sticky)."""
    base = tier_base(settings)
    return base if settings.local_tier.folder else base.parent


def _place_tier(settings: Settings, root_check: FolderCheck, environ: Mapping[str, str],
                no_hook: str | None) -> tuple[dict[str, object], list[str]]:
    """Whether the node-local tier is on for these settings, where, and why (what doctor and
    ``env --json`` show), with the warnings: a tier that is wanted but whose folder cannot be
    used is off, with one line, and jobs use the cache root as without it."""
    mode = settings.local_tier.mode
    local = tier_folder(settings)
    info: dict[str, object] = {"on": False, "mode": mode, "local": str(local), "shared": None,
                               "max_bytes": settings.local_tier.max_size, "why": None,
                               "problem": None}
    where = f"the cache root is on {root_check.fs_type}"
    if _user_set(TIER_VAR, environ) and not environ[TIER_VAR]:
        info["why"] = f"turned off for these jobs by {TIER_VAR}='' in the environment"
    elif root_check.problem:
        info["why"] = "the cache root cannot be used"
    elif mode == "off":
        info["why"] = "local_tier.mode: off"
    elif mode == "auto" and not root_check.network:
        fuse = " (a FUSE filesystem: set local_tier.mode: on if it is remote)" \
            if root_check.family == "fuse" else ", local to this node"
        info["why"] = f"{where}{fuse} (local_tier.mode: auto)"
    else:
        info["why"] = "local_tier.mode: on" if mode == "on" else \
            f"{where}, a network filesystem (local_tier.mode: auto)"
        problem = no_hook and "its reads and promotions need gpu-cache's startup hook, which cannot load"
        warnings: list[str] = []
        if problem is None and local is not None:
            # The folder that holds it is judged first: nothing is made in one not trusted.
            problem = check_folder(local.parent, create=False, shared_group=settings.shared_group,
                                   min_free=0, probe=False,
                                   trusted_above=tier_trusted_above(settings)).problem
        if problem is None and local is not None:
            check = check_folder(local, shared_group=settings.shared_group,
                                 min_free=settings.min_free_space,
                                 trusted_above=tier_trusted_above(settings), private=True)
            problem = check.problem or (f"{local} is read-only" if check.read_only else None)
            warnings = [f"local tier: {line}" for line in check.warnings]
            info.update(fs_type=check.fs_type, free_bytes=check.free_bytes)
            for name in kinds.TIERED if problem is None else ():
                inner = check_folder(kinds.KINDS[name].folder(local), shared_group=settings.shared_group,
                                     min_free=0, trusted_above=local, probe=False, private=True)
                problem = inner.problem
                if problem:
                    break
        if problem:
            info["problem"] = problem
            return info, [f"local tier: {problem}; it is off, and jobs read and write the cache "
                          f"root {settings.cache_root} directly"]
        info.update(on=True, shared=str(settings.cache_root))
        return info, warnings
    return info, []


def check_kind(settings: Settings, kind: str) -> FolderCheck:
    """Probe one kind's folder under the (set) cache root, as the settings ask: created
    group-shared in shared-group mode, trusted from the root down, with enough free space."""
    assert settings.cache_root is not None
    return check_folder(kinds.KINDS[kind].folder(settings.cache_root),
                        shared_group=settings.shared_group, min_free=settings.min_free_space,
                        trusted_above=settings.cache_root)


@dataclass
class _Placement:
    """Where one kind's cache goes: variables to set, and why it is not the shared folder."""

    values: dict[str, str] = field(default_factory=dict)
    problem: str | None = None
    adjusted: str | None = None
    xla_caches_off: bool = False  # XLA's own caches must stay off (a network filesystem)


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


def _place(kind: CacheKind, root: Path, check: FolderCheck, xla_caches: str,
           hook: bool = True) -> _Placement:
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
            if check_folder(fallback, trusted_above=fallback.parent).problem is None:
                return _Placement(
                    {kind.env_var: str(fallback), SEED_VAR: str(folder),
                     "TRITON_CACHE_MANAGER": SEED_MANAGER},
                    adjusted=f"{folder} is read-only: its kernels are read as a seed, new ones "
                             f"go to node-local {fallback}")
            problem = f"{folder} is read-only and its node-local fallback failed"
        else:
            problem = f"{folder} is read-only and {kind.name} fails when it cannot write"
    if problem is None:
        placed = _Placement({kind.env_var: str(folder)})
        if kind.name == "jax" and check.network and xla_caches != "none":
            placed.adjusted = (
                f"{folder} is on {check.fs_type}, where XLA's autotune cache fails atomic renames "
                f"and crashes; exporting JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES=none instead of "
                f"{xla_caches!r}")
            placed.xla_caches_off = True
        return placed
    if kind.switch_off is not None:
        name, value = kind.switch_off
        return _Placement({name: value}, problem=f"{problem}; {kind.name} runs without its "
                                                 "persistent cache")
    fallback = node_local_fallback(kind.name)
    local = check_folder(fallback, trusted_above=fallback.parent)
    if local.problem is None:
        return _Placement({kind.env_var: str(fallback)},
                          problem=f"{problem}; using node-local {fallback} instead")
    return _Placement(problem=f"{problem}; node-local fallback failed too: {local.problem}")


def _place_locks(settings: Settings, root: Path, root_problem: str | None
                 ) -> tuple[dict[str, str], dict[str, object], list[str]]:
    """Where single-flight's lock files go: ``<root>/locks``, else (a read-only or unusable
    root) a node-local folder; off where flock does not work in either. Its mode: "cluster"
    (leases across nodes) on a shared filesystem where they work, else "node", with why.
    Returns the variables, what doctor shows, and warnings."""
    timeout = settings.single_flight.timeout_seconds
    info: dict[str, object] = {"enabled": False, "locks": None, "timeout_seconds": timeout,
                               "problem": None, "per_node": False, "mode": None, "why": None}
    if not settings.single_flight.enabled:
        info["problem"] = "turned off in the config (single_flight.enabled: false)"
        return {LOCKS_VAR: ""}, info, []
    fallback = node_local_fallback(LOCKS_FOLDER)
    places = [(fallback, fallback.parent, None)]
    if root_problem is None:
        places.insert(0, (root / LOCKS_FOLDER, root, settings.shared_group))
    problems: list[str] = []
    for folder, above, group in places:
        check = check_folder(folder, shared_group=group, min_free=0, trusted_above=above, probe=False)
        problem = check.problem or flock_problem(folder)
        if problem:
            problems.append(problem)
            continue
        warnings = []
        shared = check.network or check.family == "fuse"
        mode = "node"
        if problems:
            why = f"node-local folder ({problems[0]})"
            warnings.append(f"single-flight: {problems[0]}; its locks are node-local in {folder}, "
                            "so single-flight holds within this node only")
        elif not shared:
            why = f"{check.fs_type} is local to this node"
        else:
            trouble = lease_problem(folder)
            if trouble is None:
                mode, why = "cluster", (f"{check.fs_type} may be shared by nodes, and flock there may "
                                        "lock within one node only: flock within a node, a lease per "
                                        "key across nodes")
            else:
                why = f"leases do not work on {check.fs_type}: {trouble}"
                warnings.append(f"single-flight: {folder} is on {check.fs_type}, where flock often locks "
                                f"within one node only, and {trouble}: single-flight is per node there, "
                                "and jobs on two nodes may compile the same key at once")
        info.update(enabled=True, locks=str(folder), per_node=mode == "node" and (shared or bool(problems)),
                    mode=mode, why=why)
        return {LOCKS_VAR: str(folder), LOCK_TIMEOUT_VAR: f"{timeout:g}", LOCK_MODE_VAR: mode}, info, warnings
    info["problem"] = problems[0]
    return {LOCKS_VAR: ""}, info, [f"single-flight is off (every job compiles what it misses): "
                                   f"{'; '.join(problems)}"]


def resolve(settings: Settings, environ: Mapping[str, str] | None = None) -> Exports:
    """Work out the exports for ``settings``; probes each cache folder (creates it).

    Never raises for filesystem trouble: an unusable or untrusted folder is reported in
    ``problems`` and that kind runs without a cache (JAX) or on a node-local folder (the
    others, which cannot be switched off). On a network filesystem XLA's extra caches are
    kept off whatever the config says (they fail atomic renames there and crash).
    """
    environ = os.environ if environ is None else environ
    wanted: dict[str, str] = {}
    problems: dict[str, str] = {}
    adjusted: dict[str, str] = {}
    warnings: list[str] = []
    checks: dict[str, FolderCheck] = {}
    root_problem: str | None = None
    xla_caches = settings.xla_caches
    root = settings.cache_root
    no_hook = hook_problem()
    single_flight: dict[str, object] = {
        "enabled": False, "locks": None, "timeout_seconds": settings.single_flight.timeout_seconds,
        "problem": "caching is turned off", "per_node": False, "mode": None, "why": None}
    tier: dict[str, object] = {"on": False, "mode": settings.local_tier.mode, "local": None,
                               "shared": None, "max_bytes": settings.local_tier.max_size,
                               "why": "caching is turned off", "problem": None}
    if root is None:
        wanted["GPU_CACHE_ROOT"] = "none"
        wanted["JAX_ENABLE_COMPILATION_CACHE"] = "false"
        problems["all"] = "caching is turned off (cache root 'none')"
    else:
        wanted["GPU_CACHE_ROOT"] = str(root)
        # A root that cannot be made or trusted fails every kind alike.
        root_check = check_folder(root, shared_group=settings.shared_group, min_free=0,
                                  trusted_above=root, probe=False)
        root_problem = root_check.problem
        tier, tier_warnings = _place_tier(settings, root_check, environ, no_hook)
        warnings += tier_warnings
        local = Path(str(tier["local"])) if tier["on"] else None
        for kind in (kinds.KINDS[name] for name in kinds.EXPORTED):
            if not kind.enabled(settings):
                continue
            if _user_set(kind.env_var, environ):
                wanted[kind.env_var] = str(kind.folder(local if local and kind.tiered else root))
                continue  # reported as kept: theirs is used
            check = checks[kind.name] = root_check if root_problem else check_kind(settings, kind.name)
            warnings += [f"{kind.name}: {line}" for line in check.warnings]
            if local is not None and kind.tiered and check.problem is None:
                # The job works node-locally; the hook reads the shared folder on a miss and
                # promotes new entries to it (a read-only one: they stay on this node).
                wanted[kind.env_var] = str(kind.folder(local))
                if check.read_only:  # the tier with promotion off: it stays on this node
                    adjusted[kind.name] = (f"{kind.folder(root)} is read-only: jobs read it on a miss "
                                           f"and keep new entries on this node in {kind.folder(local)}")
                if kind.name == "jax" and xla_caches == "none":
                    xla_caches = TIER_XLA_CACHES
                continue
            how = _place(kind, root, check, xla_caches, hook=no_hook is None)
            wanted.update(how.values)
            if how.problem:
                problems[kind.name] = how.problem
            if how.adjusted:
                adjusted[kind.name] = how.adjusted
            if how.xla_caches_off:
                xla_caches = "none"
        if "JAX_COMPILATION_CACHE_DIR" in wanted:
            wanted["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
            wanted["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"
            wanted["JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"] = xla_caches
        if "TRITON_CACHE_DIR" in wanted:
            # Triton's dump/override folders live under TRITON_HOME; keep them out of $HOME.
            wanted["TRITON_HOME"] = str(Path(wanted["TRITON_CACHE_DIR"]).parent / "triton-home")
            # Triton >= 3.4 then keeps autotuning results (<kernel>.autotune.json) in its cache
            # (issue 24); the job's Triton, in its image, decides: an older one ignores it.
            wanted["TRITON_CACHE_AUTOTUNING"] = "1"
        if settings.stats_hook and "jax" not in problems:
            # Judged like a kind's folder: whoever can add a record there tells validate what
            # the jobs compiled, and the Triton replay which modules to import.
            records = kinds.KINDS["records"]
            check = checks[records.name] = root_check if root_problem else check_kind(settings, records.name)
            how = _place(records, root, check, xla_caches, hook=no_hook is None)
            wanted.update(how.values)
            if how.problem:
                problems[records.name] = how.problem
        lock_values, single_flight, lock_warnings = _place_locks(settings, root, root_problem)
        wanted.update(lock_values)
        warnings += lock_warnings
        if local is not None:
            wanted.update({TIER_VAR: str(local), SHARED_VAR: str(root),
                           TIER_MAX_VAR: str(settings.local_tier.max_size)})
        elif TIER_VAR in managed_names(environ):
            wanted[TIER_VAR] = ""  # gpu-cache turned it on earlier in this process tree: now off
    exports = Exports(problems=problems, adjusted=adjusted, warnings=warnings, checks=checks,
                      root_problem=root_problem, single_flight=single_flight, tier=tier)
    for name, value in wanted.items():
        if _user_set(name, environ) and environ[name] != value:
            exports.kept[name] = (environ[name], value)
        else:
            exports.values[name] = value
    hook_needed = (settings.stats_hook and root is not None) or SEED_VAR in exports.values \
        or kinds.KINDS["bytecode"].env_var in exports.values \
        or kinds.KINDS["jax_triton"].env_var in exports.values \
        or bool(exports.values.get(LOCKS_VAR)) \
        or bool(exports.values.get(TIER_VAR)) \
        or bool(exports.values.get(kinds.KINDS["ptxas"].env_var))  # single-flight, tier, ptxas shim
    if hook_needed and no_hook:
        exports.warnings.append(no_hook)
    elif hook_needed and str(HOOK_DIR) not in environ.get("PYTHONPATH", "").split(os.pathsep):
        exports.values["PYTHONPATH"] = with_hook(environ.get("PYTHONPATH"))
    if root is not None:  # the package's folder only for the hook (not when it cannot load)
        bound = [root] if no_hook else [root, PACKAGE_PARENT]
        local = Path(str(tier["local"])) if tier["on"] else None
        if local is not None and not any(local.is_relative_to(top) for top in DEFAULT_BOUND):
            bound.append(local)  # at the same path inside, like the root
        binds, skipped = container_binds(bound, environ)
        exports.values.update(binds)
        exports.warnings += [f"containers: {path} is not bound into container jobs: a bind path "
                             "cannot hold ',' or ':'" for path in skipped]
    return exports


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
    for name in CONTAINER_BIND_VARS:
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
    merged = {"PYTHONPATH", *CONTAINER_BIND_VARS}
    return ",".join(sorted(managed_names(environ) | (set(exports.values) - merged)))


def apply(exports: Exports, environ: MutableMapping[str, str] | None = None) -> None:
    """Set ``exports.values`` in ``environ`` (default ``os.environ``) and mark them as ours."""
    environ = os.environ if environ is None else environ
    managed = _managed_after(exports, environ)
    environ.update(exports.values)
    environ[MANAGED_VAR] = managed


def warn_once(exports: Exports, environ: MutableMapping[str, str] | None = None) -> None:
    """Print the exports' messages to stderr, once per process tree."""
    environ = os.environ if environ is None else environ
    lines = exports.messages()
    if lines and environ.get(WARNED_VAR) != "1":
        import logging  # (loaded only when there is something to say)

        log = logging.getLogger(__name__)
        for line in lines:
            log.warning("%s", line)
        environ[WARNED_VAR] = "1"


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
    values[MANAGED_VAR] = _managed_after(exports, os.environ)
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in values.items())


def job_environ(exports: Exports, base: Mapping[str, str] | None = None,
                **extra: str) -> dict[str, str]:
    """The environment of a child process: ``base`` (default os.environ) with the exports
    applied, plus ``extra`` variables (e.g. GPU_CACHE_RUN_ID)."""
    environ = dict(os.environ if base is None else base)
    apply(exports, environ)
    environ.update(extra)
    return environ
