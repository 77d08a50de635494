"""gpu-cache's ptxas shim: which ptxas compiles this call (issue 37), the first part of each
entry's key. Loaded by ``kinds.ptxas.shim`` for each call it may serve. Standard library only,
Python 3.9+."""

import os

from . import shim


def _script_targets(head):
    """The absolute paths of programs a shell wrapper names (``exec /opt/cuda/bin/ptxas "$@"``),
    outside its ``#!`` line: they are part of what the wrapper runs (a log file it names is not:
    only executable files count)."""
    if not head.startswith(b"#!"):
        return []
    found = []
    for line in head.split(b"\n")[1:]:
        for word in line.replace(b'"', b" ").replace(b"'", b" ").replace(b";", b" ").split():
            if word.startswith(b"/") and shim.runnable(os.fsdecode(word)) and word not in found:
                found.append(word)
    return found


def _stat_text(path):
    info = os.stat(path)
    return b"%s\0%d\0%d" % (os.fsencode(path), info.st_size, info.st_mtime_ns)


def _digest_files(paths):
    digest = shim.sha256()
    for path in paths:
        digest.update(os.fsencode(path) if isinstance(path, str) else path)
        with open(path, "rb") as stream:
            for chunk in iter(lambda: stream.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def identity(real, folder):
    """``(digest, version text)`` of the ptxas that compiles this call.

    An ELF binary is its own file: the identity is kept per file state (path, size, mtime) in
    ``<folder>/<x>.identity``, so a call costs a few stats; made once per state by running
    ``--version`` and reading the file. Anything else is a wrapper, and which ptxas it runs
    depends on this call's environment (``exec "${CUDA_HOME:-/usr/local/cuda}/bin/ptxas"``, a
    module system): its ``--version`` is asked at every call, in this environment, and the
    digest also holds the files it names and the values of the variables it reads. Either way
    the digest holds the name ``real`` is run by, which ptxas writes into the cubin."""
    resolved = os.path.realpath(real)
    with open(resolved, "rb") as stream:
        head = stream.read(65536)
    wrapper = not head.startswith(b"\x7fELF")
    files = [resolved, *(os.fsdecode(p) for p in _script_targets(head))] if wrapper else [resolved]
    state = shim.sha256(b"\0\0".join(_stat_text(p) for p in files)).hexdigest()[:40]
    name = state + shim.IDENTITY_SUFFIX
    data = folder.read(name, shim.IDENTITY_MAGIC)
    digest, _, version = (data or b"").partition(b"\n")
    if len(digest) == 64 and not wrapper:
        return _as_called(digest.decode("ascii"), real, None), version
    version = version_of(real)  # a wrapper's: at every call, in this call's environment
    if len(digest) == 64:
        digest = digest.decode("ascii")
    else:
        digest = _digest_files(files)
        folder.write(name, shim.IDENTITY_MAGIC + digest.encode("ascii") + b"\n" + version)
    return _as_called(digest, real, head if wrapper else None), version


def _variables(text):
    """The names of the variables a script reads (``${CUDA_HOME:-...}``, ``$PTXAS_FLAGS``)."""
    names = set()
    for part in text.split(b"$")[1:]:
        part = part[1:] if part[:1] == b"{" else part
        end = 0
        while end < len(part) and (part[end:end + 1].isalnum() or part[end:end + 1] == b"_"):
            end += 1
        if end and not part[:1].isdigit():
            names.add(part[:end])
    return sorted(names)


def _as_called(digest, real, script):
    """The digest with the name the real ptxas is run by (ptxas writes it into the cubin) and,
    for a wrapper (``script``: its text), the values of the variables it reads."""
    parts = [digest.encode("ascii"), os.fsencode(real)]
    for name in _variables(script) if script is not None else ():
        parts.append(b"%s=%s" % (name, os.environb[name]) if name in os.environb else name)
    return shim.sha256(b"\0".join(parts)).hexdigest()


def version_of(real):
    """What ``real --version`` prints on stdout. Raises OSError where it fails."""
    read, write = os.pipe()
    try:
        null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        try:
            actions = [(os.POSIX_SPAWN_DUP2, write, 1), (os.POSIX_SPAWN_DUP2, null, 2)]
            pid = os.posix_spawn(real, [real, "--version"], shim.real_environ(), file_actions=actions)
        finally:
            os.close(null)
        os.close(write)
        write = None
        chunks = []
        while True:
            chunk = os.read(read, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(read)
        if write is not None:
            os.close(write)
    out = b"".join(chunks)
    if os.waitstatus_to_exitcode(status) != 0 or not out.strip():
        raise OSError(f"{real} --version failed")
    return out.strip()
