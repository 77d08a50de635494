"""What the pieces of gpu-cache's startup hook share (the package's docstring says which piece
does what): text and list limits, the owner rules, marking a hit entry used, and the ways to
single-flight and the tier. Standard library only, Python 3.9+."""

import errno
import os

from .names import LOCKS_VAR

#: At most this many entries in each list (and key_parts) of a record; the rest are counted.
MAX_ITEMS = 1000
#: At most this many characters in each name, key or argument a record keeps.
MAX_TEXT = 500


def text(value, limit=MAX_TEXT):
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[:limit] + "..."


def keep(stats, field, item):
    """Append to a record's list, up to MAX_ITEMS; count what does not fit."""
    items = stats[field]
    if len(items) < MAX_ITEMS:
        items.append(item)
    else:
        stats["dropped"][field] += 1


def safe_mode(team, folder=False):
    """The mode of a file or folder this hook creates, whatever the umask: nobody but the user
    (and the team, in a team's folder) may write it."""
    if folder:
        return 0o2770 if team is not None else 0o700
    return 0o664 if team is not None else 0o644


def replace_whole(folder_fd, temp, name, data, mode):
    """``name`` in the folder ``folder_fd`` replaced whole by ``data``: the new file ``temp``
    (never through a link) with ``mode`` set after the umask had its say, then a rename; the
    temporary file is gone if anything fails."""
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                 dir_fd=folder_fd)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                if written <= 0:
                    raise OSError(errno.EIO, "short write", temp)
                view = view[written:]
        finally:
            os.close(fd)
        os.replace(temp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    except BaseException:
        try:
            os.unlink(temp, dir_fd=folder_fd)
        except OSError:
            pass
        raise


def missing_folders(path):
    """``path`` and the folders above it that do not exist, outermost first."""
    missing = []
    while not os.path.lexists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing[::-1]


def make_folders(path):
    """Create ``path`` and the folders above it that are missing, each with :func:`safe_mode`
    of the folder it is made in (``os.makedirs`` leaves the folders above to the umask: 0777
    under umask 000)."""
    from .owners import team_gid  # (with the record, at exit: not with every piece)

    for folder in missing_folders(path):
        try:
            os.mkdir(folder, safe_mode(team_gid(os.stat(os.path.dirname(folder))), folder=True))
        except FileExistsError:
            pass


def touch(path):
    """Mark a cache entry as used now (never through a symlink); a read-only cache just goes
    unmarked."""
    try:
        os.utime(path, follow_symlinks=False)
    except (OSError, NotImplementedError):
        pass


def part(hook, kind, fields):
    """The record's part of ``kind`` in this process, made of ``fields`` on first use."""
    found = hook.parts.get(kind)
    if found is None:
        found = hook.parts[kind] = fields
    return found


def section(hook, kind):
    """The record's part of ``kind`` at exit, with single-flight's and the tier's; None where
    its library was not imported, or nothing was counted."""
    if kind not in hook.libraries or kind not in hook.parts:
        return None
    return {**hook.parts[kind], "single_flight": flight_stats(hook, kind), "tier": tier_stats(hook, kind)}


def flight(hook):
    """gpu-cache's single-flight module (``flight``), told how this hook warns."""
    from . import flight as module

    module.configure(hook.warn)
    return module


def flight_off(hook, kind, why):
    try:
        flight(hook).disable(kind, why)
    except Exception:
        pass


def wrappers_off(hook, kind, tier, why):
    """Single-flight and the ``tier`` (None: off) off for ``kind`` in this process, for ``why``:
    its wrappers could not be installed, and the job runs as without them."""
    why = str(why)[:300]
    if hook.flight:
        flight_off(hook, kind, why)
    if tier is not None:
        tier.disable(kind, why)


def flight_stats(hook, kind):
    """What single-flight did for ``kind``, for the record."""
    if not hook.flight:
        refused = hook.parts.get("fallbacks", {}).get("locks", {}).get("refused")
        return {"state": text(f"off: {refused}" if refused else f"off: {LOCKS_VAR} is not set", 300)}
    try:
        return flight(hook).stats(kind)
    except Exception as exc:
        return {"state": text(f"off: {exc!r}", 300)}


def tier(hook):
    """This process's node-local tier (``tier``), or None where it is off."""
    if not hook.tier:
        return None
    from . import tier as module

    return module.get(hook.warn, hook.pieces)


def tier_stats(hook, kind):
    """What the tier did for ``kind``, for the record (None: the tier is off)."""
    try:
        found = tier(hook)
        return found.record(kind) if found is not None else None
    except Exception as exc:
        return {"state": text(f"off: {exc!r}", 300)}
