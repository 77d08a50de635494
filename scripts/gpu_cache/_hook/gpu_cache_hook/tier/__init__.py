"""gpu-cache's startup hook, the node-local tier (issue 23): loaded when a tiered kind's piece
asks for it (its library imported) and ``$GPU_CACHE_TIER`` and ``$GPU_CACHE_SHARED`` are
absolute folders.

The caches of the tiered kinds (those whose piece declares a ``tier`` layout) work in
``$GPU_CACHE_TIER/<kind>`` (the local tier, on the node's own disk); ``$GPU_CACHE_SHARED/<kind>``
(the cache root, often on a network filesystem) is the shared tier. The kinds' pieces move
whole entries between them through this module:

- **fetch**: an entry missing locally that the shared tier has is copied into a temporary file
  in the local kind folder, then linked to its name (never over an entry that is there);
  temporary files of both tiers are thus always ``<kind folder>/.gpu-cache-tmp.*``. A file
  another user may have written (the trust rule, for each file) is never fetched, and nor is
  one whose bytes are not those prune sealed it with (``seals``: same-size damage),
  which is set aside in the shared tier: the tool compiles it anew, and the record's ``tier``
  part counts it (``damaged``, ``untrusted``);
- **promote**: an entry this process just wrote locally is copied into a temporary file
  ``.gpu-cache-tmp.<host>.<pid>.<random>`` in the shared kind folder, then ``os.link``-ed to
  its name, which never replaces an existing entry and is atomic; where the filesystem has no
  hard links, ``os.rename`` only when the name is free. An entry of several files is promoted
  in the order its piece gives (the file that makes it whole last). A kill -9 at any point thus
  leaves at most a temporary file (prune removes old ones), never a partial entry, and loses no
  complete one.
- **trees**: a tree a piece fetched whole (``fetch_tree``) is promoted again at exit;
- **bound**: at exit, the local tier is cut to ``$GPU_CACHE_TIER_MAX_BYTES``, least recently
  used whole entries first, as each tiered kind's piece declares its layout (``tier.bound``).
- **set aside**: before the tier serves anything of a kind, once per process, its local copies
  of entries that validation set aside in the shared root are dropped
  (``tier.set_aside``).

Every shared and local kind folder is opened without following a link and used through its
descriptor; one that is not a folder of this user (or root; or the team's, where the shared
root is a group's) or that others can write is never read from nor written into: entries stay
local. A failure never reaches the job: that entry stays local (or is compiled), the record's
``tier`` part counts it, and the process prints one warning line at most. Standard library
only, Python 3.9+.
"""

import errno
import os
import stat
import threading
import time
import zlib

from .. import locks as lock_files
from .. import seals
from ..names import SHARED_VAR, TEMP_PREFIX, TIER_MAX_BYTES_VAR, TIER_TEST_PAUSE_VAR, TIER_VAR
from ..owners import owner_problem
from . import bound, files, set_aside


def _counts():
    return {"fetched": 0, "fetched_bytes": 0, "promoted": 0, "promoted_bytes": 0,
            "promote_failed": 0, "damaged": 0, "untrusted": 0, "set_aside": 0, "seconds": 0.0}


class Tier:
    """The tier of this process: where the two tiers are, what it moved, what is off.
    ``layouts``: ``(kind, its layouts' words)`` of each tiered kind, for the bound."""

    def __init__(self, local, shared, max_bytes, warn, layouts=()):
        self.local = files.Side(local, create=True)
        self.shared = files.Side(shared, create=False)
        self.max_bytes = max_bytes
        self.warn = warn
        self.layouts = tuple(layouts)
        self.stats = {}
        self.off = {}  # kind -> why the tier is off for it
        self.known = {}  # tree kind folder -> names known to be in the shared tier
        self.seals = {}  # kind -> the shared kind folder's seals (seals)
        self.mutex = threading.Lock()
        self.checked = set()  # kinds whose set-aside entries are gone from the local tier
        self.checking = threading.Lock()
        self.pid = os.getpid()
        self.host = "".join(c if c.isalnum() or c in "-_" else "_" for c in os.uname().nodename)[:64]

    # --- what the record says ------------------------------------------------------------

    def counts(self, kind):
        with self.mutex:
            return self.stats.setdefault(kind, _counts())

    def disable(self, kind, why):
        self.off.setdefault(kind, str(why)[:300])

    def enabled(self, kind):
        """Whether the tier works for ``kind``; the first call per kind drops the local copies
        of what was set aside (every way into a kind's local folder asks this first)."""
        if kind not in self.checked:
            with self.checking:
                if kind not in self.checked:
                    self._drop_set_aside(kind)
                    self.checked.add(kind)
        return kind not in self.off

    def _drop_set_aside(self, kind):
        try:
            removed = set_aside.check(self, kind)
        except Exception as exc:  # never into the job; the next process tries again
            if isinstance(exc, files.Refused):
                self.disable(kind, exc.strerror)
            if self.warn is not None:
                self.warn(f"node-local tier ({kind}: dropping the entries set aside in the shared root)", exc)
            return
        if removed:
            self.counts(kind)["set_aside"] += removed

    def record(self, kind):
        """The record's ``tier`` part of ``kind``."""
        out = dict(self.counts(kind))
        out["seconds"] = round(out["seconds"], 3)
        out["local"] = os.path.join(self.local.root, kind)
        out["shared"] = os.path.join(self.shared.root, kind)
        if kind in self.off:
            out["state"] = f"off: {self.off[kind]}"
        elif f"{kind}:promote" in self.off:
            out["state"] = f"on, promotion off: {self.off[kind + ':promote']}"
        else:
            out["state"] = "on"
        return out

    def local_folder(self, kind):
        return os.path.join(self.local.root, kind)

    def shared_folder(self, kind):
        return os.path.join(self.shared.root, kind)

    def failed(self, what, exc):
        """The process's one warning line (the hook's, printed once at most)."""
        if self.warn is not None:
            self.warn(f"node-local tier ({what}); entries stay local", exc)

    # --- moving one file -------------------------------------------------------------------

    def place(self, src_fd, src_name, tmp_fd, dst_fd, dst_name, check=None, pause=False,
              rewrite=None, fetched=None):
        """Copy ``src_name`` (in folder ``src_fd``) to a temporary file in ``tmp_fd``, then give
        it the name ``dst_name`` in ``dst_fd`` without replacing anything there. Returns the
        bytes placed, 0 when the name was taken meanwhile or the source is not whole (``check``)
        or not a regular file. ``fetched``: (kind, the file's path in the shared kind folder)
        when fetching: 0 also for a file another user may have written, or one not as prune
        sealed it (set aside). Raises OSError."""
        try:
            fd = os.open(src_name, files.READ, dir_fd=src_fd)
        except FileNotFoundError:
            return 0
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or (check is not None and not check(fd, info.st_size)):
                return 0
            if fetched is not None and owner_problem(info, self.shared.team_gid, where=fd):
                self.counts(fetched[0])["untrusted"] += 1
                return 0
            crc = None
            if rewrite is not None:
                original = files.read_all(fd, info.st_size)
                crc, data = zlib.crc32(original), rewrite(original)
                if data is None:
                    return 0
                chunks = [data]
            else:
                chunks = None
            tmp = f"{TEMP_PREFIX}{self.host}.{os.getpid()}.{os.urandom(6).hex()}"
            out = os.open(tmp, files.CREATE, 0o666, dir_fd=tmp_fd)
            try:
                try:
                    files.harden(out, os.fstat(tmp_fd))
                    if chunks is not None:
                        size = files.write_all(out, chunks)
                    else:
                        size, crc = files.copy_fd(fd, out)
                finally:
                    os.close(out)
                if chunks is None and size != info.st_size:
                    raise OSError(errno.EIO, f"{src_name} changed while it was copied")
                if fetched is not None and self._seals(fetched[0]).damaged(fetched[1], fd, info, crc):
                    self._damaged(fetched[0], src_fd, src_name, info)
                    return 0
                if pause:
                    _pause_for_tests()
                placed = files.link_new(tmp, tmp_fd, dst_fd, dst_name)
            finally:
                try:
                    os.unlink(tmp, dir_fd=tmp_fd)
                except OSError:
                    pass
            return size if placed else 0
        finally:
            os.close(fd)

    def _seals(self, kind):
        with self.mutex:
            if kind not in self.seals:
                self.seals[kind] = seals.Seals(self.shared.folder(kind), self.shared.team_gid)
            return self.seals[kind]

    def _damaged(self, kind, folder_fd, name, info):
        """A shared file not as prune sealed it: a miss (the tool compiles it anew, and the
        promotion puts the new one there), set aside so that no node reads it again."""
        self.counts(kind)["damaged"] += 1
        try:
            lock_files.set_aside(name, info, dir_fd=folder_fd)
        except OSError:
            pass  # a read-only shared tier: refused again by the next fetch, removed by prune

    def fetch(self, kind, name, check=None):
        """Copy the shared entry ``<kind>/<name>`` (one file) into the local tier when it is
        missing there. Whether the local tier has it now. Never raises."""
        if not self.enabled(kind):
            return False
        started = time.monotonic()
        try:
            local = self.local.folder(kind)
            try:
                os.stat(name, dir_fd=local, follow_symlinks=False)
                return True
            except FileNotFoundError:
                pass
            size = self.place(self.shared.folder(kind), name, local, local, name, check,
                              fetched=(kind, name))
        except FileNotFoundError:
            return False
        except Exception as exc:  # never into the job: the entry stays where it is
            self.refused(kind, exc, fetching=True)
            return False
        self.fetched(kind, size, started)
        return bool(size) or files.exists(self.local, kind, name)

    def promote(self, kind, name, check=None):
        """Promote the local entry ``<kind>/<name>`` (one file) to the shared tier, unless it
        is there. Whether the shared tier has it now. Never raises."""
        if not self.promoting(kind):
            self.counts(kind)["promote_failed"] += 1
            return False
        started = time.monotonic()
        try:
            shared = self.shared.folder(kind)
            size = self.place(self.local.folder(kind), name, shared, shared, name, check,
                              pause=True)
        except Exception as exc:  # never into the job: the entry stays where it is
            self.refused(kind, exc)
            self.counts(kind)["promote_failed"] += 1
            return False
        self.promoted(kind, size, started)
        return True

    def fetched(self, kind, size, started):
        if size:
            stats = self.counts(kind)
            stats["fetched"] += 1
            stats["fetched_bytes"] += size
            stats["seconds"] += time.monotonic() - started

    def promoted(self, kind, size, started):
        stats = self.counts(kind)
        if size:
            stats["promoted"] += 1
            stats["promoted_bytes"] += size
        stats["seconds"] += time.monotonic() - started

    def refused(self, kind, exc, fetching=False):
        """A kind folder the rules refuse, a filesystem error, or any other failure: warn
        once. A refused kind folder turns the tier off for the kind, a read-only (or full, or
        not writable) shared one promotion (copy-in goes on); other errors count per entry."""
        if isinstance(exc, files.Refused):
            self.disable(kind, exc.strerror)
        elif not fetching and getattr(exc, "errno", None) in (errno.EROFS, errno.EACCES, errno.EPERM,
                                                               errno.ENOSPC, errno.EDQUOT):
            self.off.setdefault(f"{kind}:promote", exc.strerror or repr(exc))
        self.failed(kind, exc)

    def promoting(self, kind):
        return kind not in self.off and f"{kind}:promote" not in self.off

    # --- trees: the files below a kind folder, copied as they are ----------------------------

    def fetch_tree(self, kind, sub=""):
        """Copy the files of the shared ``<kind>/<sub>`` tree missing locally (at most
        bound.MAX_TREE_FILES looked at). Never raises."""
        if not self.enabled(kind):
            return
        started = time.monotonic()
        fetched = size = 0
        try:
            shared_root = os.path.join(self.shared_folder(kind), sub)
            local_root = os.path.join(self.local_folder(kind), sub)
            self.shared.folder(kind)  # the rules, for the kind folder
            known = self.known.setdefault((kind, sub), set())
            for rel in bound.tree_files(shared_root):
                known.add(rel)
                if os.path.lexists(os.path.join(local_root, rel)):
                    continue
                folder, name = os.path.split(rel)
                src = files.open_below(self.shared, kind, os.path.join(sub, folder), make=False)
                dst = files.open_below(self.local, kind, os.path.join(sub, folder), make=True)
                try:
                    placed = self.place(src, name, self.local.folder(kind), dst, name,
                                        fetched=(kind, os.path.join(sub, rel)))
                finally:
                    os.close(src)
                    os.close(dst)
                fetched += bool(placed)
                size += placed
        except FileNotFoundError:
            pass
        except Exception as exc:  # never into the job: the entry stays where it is
            self.refused(kind, exc, fetching=True)
        stats = self.counts(kind)
        stats["fetched"] += fetched
        stats["fetched_bytes"] += size
        stats["seconds"] += time.monotonic() - started

    def promote_tree(self, kind, sub="", skip=None):
        """Promote the local ``<kind>/<sub>`` files that the shared tier lacks (as far as this
        process knows: what it saw there or promoted), except those below the folder ``skip``.
        Never raises."""
        if not self.promoting(kind):
            return
        started = time.monotonic()
        known = self.known.setdefault((kind, sub), set())
        local_root = os.path.join(self.local_folder(kind), sub)
        size = promoted = 0
        try:
            for rel in bound.tree_files(local_root):
                if rel in known or (skip and rel.startswith(skip.rstrip(os.sep) + os.sep)):
                    continue
                folder, name = os.path.split(rel)
                src = files.open_below(self.local, kind, os.path.join(sub, folder), make=False)
                dst = files.open_below(self.shared, kind, os.path.join(sub, folder), make=True)
                try:
                    placed = self.place(src, name, self.shared.folder(kind), dst, name, pause=True)
                finally:
                    os.close(src)
                    os.close(dst)
                known.add(rel)
                promoted += bool(placed)
                size += placed
        except FileNotFoundError:
            pass
        except Exception as exc:  # never into the job: the entry stays where it is
            self.refused(kind, exc)
            self.counts(kind)["promote_failed"] += 1
        stats = self.counts(kind)
        stats["promoted"] += promoted
        stats["promoted_bytes"] += size
        stats["seconds"] += time.monotonic() - started

    # --- the bound ---------------------------------------------------------------------------

    def trim(self, now=None):
        """The bound (``tier.bound``). Never raises."""
        if not self.max_bytes or self.max_bytes <= 0:
            return None
        try:
            return bound.trim(self.local.root, self.max_bytes, self.layouts, now)
        except Exception as exc:
            self.failed("trimming the local tier", exc)
            return None

    def at_exit(self):
        """Promote what is left of the trees this process fetched, then the bound."""
        if os.getpid() != self.pid:  # a forked child: its parent does this
            return
        for kind, sub in list(self.known):
            self.promote_tree(kind, sub)
        self.trim()


# --- helpers -----------------------------------------------------------------------------

def _pause_for_tests():
    """Tests only: create the file the variable names, then wait until the test removes it (at
    most 120 s): a test kills the process there, or lets it go on at a moment of its choosing."""
    where = os.environ.get(TIER_TEST_PAUSE_VAR)
    if where and os.path.isabs(where):
        os.close(os.open(where, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
        until = time.monotonic() + 120
        while os.path.lexists(where) and time.monotonic() < until:
            time.sleep(0.05)


# --- the process's tier ------------------------------------------------------------------

_TIER = None
_INIT = threading.Lock()


def configured(environ):
    """``(local, shared, max_bytes)`` from the environment, or None when the tier is off."""
    local, shared = environ.get(TIER_VAR) or "", environ.get(SHARED_VAR) or ""
    if not (os.path.isabs(local) and os.path.isabs(shared)):
        return None
    try:
        max_bytes = int(environ.get(TIER_MAX_BYTES_VAR) or 0)
    except ValueError:
        max_bytes = 0
    return os.path.normpath(local), os.path.normpath(shared), max_bytes


def layouts(pieces):
    """``(kind, its layouts' words)`` of each of the ``pieces`` that declares a tier layout."""
    return [(piece.kind, piece.tier) for piece in pieces if piece.tier]


def get(warn=None, pieces=()):
    """This process's tier (made on first use, its exit work registered then), or None;
    ``pieces``: the kinds' pieces, whose tier layouts its bound trims by."""
    global _TIER
    if _TIER is None:
        with _INIT:
            if _TIER is None:
                found = configured(os.environ)
                if found is None:
                    return None
                import atexit

                _TIER = Tier(*found, warn, layouts(pieces))
                atexit.register(_TIER.at_exit)
    return _TIER
