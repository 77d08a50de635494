"""gpu-cache's startup hook, keyed build folders: what a kind's piece needs to keep a tool's
builds of a library whole across processes, as the host keeps its layouts
(``gpu_cache.core.kinds.layouts``). The torch extensions piece builds on it; a FlashInfer-like
JIT that builds a library per key with ninja would too. No kind's name is in it.

An entry is a folder ``<kind folder>/<name>-<key>`` of plain files, the key a digest of the
parts the piece gives (:meth:`KeyedBuild.keyed`). The tool builds in a folder handed out
(:func:`hand_out`: new, ``0700``, that only this user can write, in the kind's folder where
nobody else may write that), which is then sealed (the library and what the piece keeps beside
it, made unwritable by others; the manifest, :data:`MANIFEST`: the key parts, the library's size
and SHA-256, and the size, mtime and SHA-256 of each header it included) and renamed into place
whole. A build that read a file changed since its key was taken is not kept. An entry is served
only whole: its folder and library this user's (or root's, or the team's) and written by nobody
else, the library's digest as built, every header as built; else the process builds (a changed
header: a new entry replaces the stale one). With single-flight, one process builds a key and
the others wait for its entry. Standard library only, Python 3.9+.
"""

import errno
import hashlib
import json
import os
import stat
import time

from . import common, owners
from .common import keep, text
from .names import TEMP_PREFIX

#: The file of an entry that says what it is; written last, inside the temporary folder.
MANIFEST = "gpu-cache-build.json"
FORMAT = 1
#: Characters of the key (hex digits of a SHA-256) in an entry's folder name.
KEY_LENGTH = 32
#: Largest manifest read.
MANIFEST_LIMIT = 16 << 20
#: How far a file's time may lag ``time.time_ns()``: the kernel stamps files from its coarse
#: clock, a tick behind.
CLOCK_SLACK_NS = 50_000_000
#: Longest a helper program (ninja, a compiler asked its version) may take.
HELPER_TIMEOUT = 60.0

_HANDED = {}  # a build folder handed out -> the team of the kind folder it is in


def hand_out(kind, folder, name, stats, hook):
    """A new folder for one build of ``kind``, that only this user can write, where the tool
    writes its sources and the build runs: in the kind's folder ``folder`` where nobody else may
    write that (else a private folder of this process, no cache; ``stats["refused"]`` says why)."""
    import tempfile

    try:
        common.make_folders(folder)
        info = os.stat(folder)
        team = owners.team_gid(info)
        if team is not None and team != os.getegid() and team not in os.getgroups():
            team = None  # a group this user is not in is no team of theirs
        why = owners.owner_problem(info, team, where=folder) if stat.S_ISDIR(info.st_mode) else "not a folder"
        if why is None:
            temp = tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}build.", dir=folder)
            _HANDED[temp] = team
            return temp
    except OSError as exc:
        why = f"unusable ({exc.strerror})"
    why = text(f"{folder} is {why}", 500)
    stats["refused"] = why
    hook.warn(kind, PermissionError(errno.EPERM, f"{why}: built in a private folder"), off=True)
    from . import trust

    return trust.private_folder(os.path.join(kind, name))


def handed(folder):
    """``(True, team)`` where ``folder`` is one :func:`hand_out` handed out (once), else
    ``(False, None)``: a build folder of the caller's own, left alone."""
    folder = os.path.normpath(folder)
    return (True, _HANDED.pop(folder)) if folder in _HANDED else (False, None)


class Changed(Exception):
    """A file the build read changed since its key was taken."""


class KeyedBuild:
    """One build of a tool into a kind's folder, keyed: whether its entry is whole, and how it
    is served (a hit, or a wait for the process that builds it, or a build). A piece subclasses
    it with the tool's part: :meth:`build`, :meth:`load`, :meth:`library`, and where they apply
    :meth:`inputs` and :meth:`headers`; ``keeps``: the files kept beside the library."""

    kind = ""
    keeps = ()

    def __init__(self, temp, team, hook):
        self.temp, self.team, self.hook = temp, team, hook
        self.folder = os.path.dirname(temp)
        # a file the build reads changed from here on was not what the key saw (_seal)
        self.since = time.time_ns() - CLOCK_SLACK_NS
        self.name = self.key = self.entry_name = self.entry = None
        self.parts = {}

    def keyed(self, name, parts):
        """Name the entry: ``<name>-<key>``, the key a digest of ``parts`` (text each, as records
        and manifests keep them: ``doctor --explain`` names the one that changed)."""
        self.name = name
        self.key = digest(json.dumps(parts, sort_keys=True).encode())[:KEY_LENGTH]
        self.parts = {part: shown(value) for part, value in parts.items()}
        self.entry_name = f"{name}-{self.key}"
        self.entry = os.path.join(self.folder, self.entry_name)

    # --- the tool's part -----------------------------------------------------------------------

    def build(self):
        """Run the tool's build in ``self.temp``; raises as the tool."""
        raise NotImplementedError

    def load(self, where):
        """What the tool gives its caller for the build in the folder ``where``."""
        raise NotImplementedError

    def library(self):
        """The name of the file the build makes in its folder."""
        raise NotImplementedError

    def inputs(self):
        """The files the build read whose change while it ran means it is not kept (besides
        those in the folder handed out, which are its own)."""
        return []

    def headers(self):
        """``{path: [size, mtime_ns, sha256]}`` of each other file the build included, checked
        when its entry is served. Raises :class:`Changed` for one changed since the key."""
        return {}

    # --- whole entries ---------------------------------------------------------------------------

    def whole(self):
        """The entry's manifest where the entry is whole and this user's, else (None, why)."""
        team = self.team
        try:
            info = os.lstat(self.entry)
        except FileNotFoundError:
            return None, "no entry"
        except OSError as exc:
            return None, text(f"unreadable ({exc})", 300)
        if not stat.S_ISDIR(info.st_mode):
            return None, "not a folder where the entry should be"
        why = owners.owner_problem(info, team, where=self.entry)
        if why:
            return None, f"the entry's folder is not trusted ({why})"
        try:
            manifest = json.loads(read_manifest(os.path.join(self.entry, MANIFEST)))
            library = manifest["library"]
            if manifest.get("format") != FORMAT or manifest.get("key") != self.key or "/" in library:
                return None, "its manifest is not this key's"
            found, sha256 = file_digest(os.path.join(self.entry, library))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return None, text(f"not whole ({exc.__class__.__name__}: {exc})", 300)
        why = owners.owner_problem(found, team, where=os.path.join(self.entry, library))
        if why or found.st_size != manifest.get("size") or sha256 != manifest.get("sha256"):
            return None, f"its library is {why or 'not as built'}"
        changed = changed_header(manifest.get("headers"))
        if changed:
            return None, text(f"a header it includes changed: {changed}", 300)
        return manifest, None

    def serve(self, stats):
        """Load the entry (a hit), or wait for the process that builds it, or build it;
        ``stats``: the record's part of the kind."""
        manifest, why = self.whole()
        if manifest is not None:
            loaded = self._hit(manifest, stats)
            if loaded is not None:
                return loaded
            why = "its entry was removed while it was loaded"
        lock = None
        if self.hook.flight:
            def read():
                return self.whole()[0]

            def peek():
                return read() if os.path.isdir(self.entry) else None

            try:
                manifest, lock = common.flight(self.hook).lead(self.kind, self.key, self.folder, read, peek)
            except Exception as exc:  # the hook's own fault: built as without single-flight
                self.hook.warn(f"{self.kind} single-flight", exc)
                manifest = None
            loaded = None if manifest is None else self._hit(manifest, stats, waited=True)
            if loaded is not None:
                return loaded
        where = None
        try:
            where = self._build(stats, why)
        finally:
            if lock is not None:
                lock.release(wrote=where == self.entry)
        return self.load(where)

    def _hit(self, manifest, stats, waited=False):
        """The loaded entry, counted as a hit; None where it was removed before it loaded."""
        try:
            loaded = self.load(self.entry)
        except (ImportError, OSError):
            if os.path.isdir(self.entry):
                raise  # it is there: the tool's own error, as without the hook
            return None
        stats["hits"] += 1
        stats["waited"] += waited
        saved = manifest.get("build_seconds")
        stats["saved_seconds"] += saved if isinstance(saved, (int, float)) else 0.0
        keep(stats, "hit_keys", text(self.entry_name))
        common.touch(self.entry)  # its last use
        remove(self.temp)  # (what the tool wrote there)
        return loaded

    # --- a build -------------------------------------------------------------------------------

    def _build(self, stats, why):
        """Build in the folder handed out, then rename it into place whole; the folder the
        library is in. Where gpu-cache cannot keep it, or the build read a file changed since
        the key was taken, the build is loaded from where it was made. A failed build raises as
        the tool's."""
        stats["misses"] += 1
        missed = {"name": text(self.name), "key": text(self.entry_name), "parts": self.parts, "why": why}
        keep(stats, "missed", missed)
        began = time.monotonic()
        try:
            self.build()
        except BaseException:
            remove(self.temp)
            raise
        seconds = time.monotonic() - began
        stats["compile_seconds"] += seconds
        try:
            self._seal(seconds)
            self._place(self.temp)
        except Changed as exc:  # what it compiled may not be what its key names
            missed["not_kept"] = text(str(exc), 300)
            return self.temp
        except Exception as exc:  # loaded from where it is; prune removes it later
            self.hook.warn(f"{self.kind}: a build not kept", exc)
            return self.temp
        return self.entry

    def _seal(self, seconds):
        """Keep the library and what the piece keeps beside it alone (made unwritable by others
        whatever the umask), then write the manifest. Raises :class:`Changed` where an input or
        header the build read changed since the key was taken (its mtime, as ninja judges)."""
        temp, team, library = self.temp, self.team, self.library()
        for path in self.inputs():
            if os.path.dirname(os.path.abspath(path)) != temp and os.stat(path).st_mtime_ns >= self.since:
                raise Changed(f"{path} changed while it was built")
        headers = self.headers()
        for name in os.listdir(temp):
            path = os.path.join(temp, name)
            if name != library and name not in self.keeps:
                remove(path)
            else:
                os.chmod(path, os.lstat(path).st_mode & (0o7775 if team is not None else 0o7755))
        os.chmod(temp, common.safe_mode(team, folder=True))
        info, sha256 = file_digest(os.path.join(temp, library))
        manifest = {"format": FORMAT, "key": self.key, "name": self.name, "parts": self.parts,
                    "library": library, "size": info.st_size, "sha256": sha256, "headers": headers,
                    "build_seconds": round(seconds, 3)}
        fd = os.open(temp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            common.replace_whole(fd, f"{MANIFEST}.tmp", MANIFEST, json.dumps(manifest).encode(),
                                 common.safe_mode(team))
        finally:
            os.close(fd)

    def _place(self, temp):
        """Rename the build into place. Where a whole entry is there already (another process
        built it meanwhile) it stays and the build goes; a stale or broken one is renamed away
        first (a process that loaded it keeps what it mapped)."""
        import secrets

        for _attempt in range(3):
            try:
                os.rename(temp, self.entry)
                return
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
            if self.whole()[0] is not None:
                remove(temp)
                return
            stale = os.path.join(self.folder, f"{TEMP_PREFIX}{self.entry_name}.stale.{secrets.token_hex(4)}")
            try:
                os.rename(self.entry, stale)
            except FileNotFoundError:
                continue
            remove(stale)
        raise OSError(errno.EEXIST, "keeps being replaced", self.entry)


def digest(data):
    return hashlib.sha256(data).hexdigest()


def file_digest(path):
    """(``fstat``, SHA-256) of the regular file ``path``, read through one descriptor never
    opened through a link or blocking on a FIFO."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        found = hashlib.sha256()
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            found.update(chunk)
        return info, found.hexdigest()
    finally:
        os.close(fd)


def read_manifest(path):
    """The manifest at ``path``, read whole (at most MANIFEST_LIMIT bytes)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MANIFEST_LIMIT:
            raise OSError(errno.EINVAL, "not a manifest", path)
        chunks, size = [], 0
        while size <= MANIFEST_LIMIT:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
        raise OSError(errno.EFBIG, "not a manifest", path)
    finally:
        os.close(fd)


def shown(value):
    """A key part as records and manifests keep it: whole where short, else its start and a
    digest of the whole (two that differ past the start still differ)."""
    if len(value) <= 500:
        return value
    return f"{value[:400]}... (sha256 {digest(value.encode('utf-8', 'surrogateescape'))[:16]})"


def ninja_headers(temp, skip, skip_under, since):
    """``{path: [size, mtime_ns, sha256]}`` of each file a ninja build in ``temp`` included
    (ninja's record of the compilers' dependencies) but ``skip`` (the sources: their contents
    are in the key) and those under ``skip_under`` (an installation whose version is). Raises
    :class:`Changed` for one changed at ``since`` or later: the build may have read it before."""
    import subprocess

    done = subprocess.run(["ninja", "-t", "deps"], cwd=temp, capture_output=True,
                          timeout=HELPER_TIMEOUT, check=True)
    out = {}
    for line in done.stdout.decode("utf-8", "surrogateescape").splitlines():
        if not line.startswith("    "):
            continue
        path = os.path.normpath(os.path.join(temp, line.strip()))
        if path in out or path in skip or path.startswith(skip_under):
            continue
        info, sha256 = file_digest(path)
        if info.st_mtime_ns >= since:
            raise Changed(f"{path} changed while it was built")
        out[path] = [info.st_size, info.st_mtime_ns, sha256]
    return out


def changed_header(headers):
    """The first header of a manifest's that is not as the build saw it, or None: a file of
    the same size and mtime is taken as it was (ninja's own rule), another one is read."""
    if not isinstance(headers, dict):
        return "(the manifest lists none)"
    for path, seen in headers.items():
        try:
            size, mtime_ns, sha256 = seen
            info = os.stat(path)
            if info.st_size == size and info.st_mtime_ns == mtime_ns:
                continue
            if info.st_size == size and file_digest(path)[1] == sha256:
                continue
        except (OSError, TypeError, ValueError):
            pass
        return path
    return None


def remove(path):
    import shutil

    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        os.unlink(path)
