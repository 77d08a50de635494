"""gpu-cache's ptxas shim: a cache in front of the real ptxas, the way ccache's masquerade mode
fronts a compiler (issue 34).

jaxlib assembles each jax-triton kernel's PTX with the first ``ptxas`` on ``PATH``, at the
kernel's first launch, in every process (about 1.5 s a kernel on an H200). The startup hook
(``kinds.ptxas.piece``) puts the folder ``bin/`` beside this file first on the job
process's own ``PATH``; its one file, ``ptxas``, is a ``/bin/sh`` front that starts Python
isolated (``-I -S``: the job's ``PYTHONPATH`` and the hook stay out) and calls :func:`main`.

A call the cache can serve is ``ptxas [known options] <one input> -o <output>``, the form XLA's
and jaxlib's ``CompileGpuAsmUsingPtxAs`` use (``ptxas <tmp> -o <tmp> -arch=sm_90a
--warn-on-spills``, with temporary names); the front sends the calls of XLA's own kernels
straight to the real ptxas (issue 37; ``kinds.ptxas.piece``). The input must be a regular
file, read to its end whatever ``fstat`` says; a pipe (``<(...)``, ``/dev/stdin``), a FIFO, a
socket or a device passes through unread. Its key: the identity of the ptxas that compiles
this call (:func:`identity`), the options with the file names taken out, and the input's
content. A hit writes the output byte for byte and replays stdout, stderr (the file names in
them made the caller's) and the exit code (0: only successful runs are kept, and only when the
input still reads the same after the run; a failure may be a killed or starved run, and fails
fast again). ``--version`` probes, several or no inputs, stdin, unknown options pass through to
the real ptxas untouched; so does any call where the shim meets an error before the real one ran.

The real ptxas is the one the caller would have run without the shim: the next ``ptxas`` on
``PATH`` after the shim's folder, else ``$GPU_CACHE_PTXAS_REAL`` (the one the hook found: in a
CUDA root or a CUDA wheel). Never a shim (itself, a copy, one reached through a link); a real
ptxas that is a wrapper calling ``ptxas`` again through ``PATH`` reaches the next one, uncached.

Entries are GPU binaries, so the folder (``$GPU_CACHE_PTXAS``) must be trusted at every call:
not a link, owned by you or root (or, in a team's root, by its group, one of yours), nobody
else may write to it, and no folder above it lets another user swap it (the hook's rule,
``trust.distrust_above``); each entry is checked the same way, must be as it
was written (its sha256, ``digest``'s frame: damage that keeps the size is found) and
its header must name its key. An entry that fails (or is of an older format) is set aside
(``locks.set_aside``) and counted as refused: the real ptxas runs, and its result
takes the name. Entries are written whole: a temporary file (mode ``0644``, ``0664`` in a
team's root, whatever the umask), then a hard link to the key's name (never over an existing
entry). On a miss, with single-flight on (``$GPU_CACHE_LOCKS``), one process per key runs the
real ptxas and the others wait for its entry. Each call adds a line to
``$GPU_CACHE_PTXAS_TALLY`` (in the records folder), which the hook reads into the process's
record. Standard library only, Python 3.9+.
"""

import errno
import os
import stat
import sys
import time

from ... import digest as frame
from ...digest import sha256  # the bare module's, not hashlib's: a call's start is short

# NESTED_VAR: set for the real ptxas this shim runs: a wrapper that calls ``ptxas`` again gets the next one.
from ...names import PTXAS_NESTED_VAR as NESTED_VAR
from ...names import PTXAS_REAL_VAR as REAL_VAR
from ...names import PTXAS_TALLY_VAR as TALLY_VAR
from ...names import PTXAS_VAR as CACHE_VAR
from ...names import TEMP_PREFIX as TMP_PREFIX
from ...owners import owner_problem, team_gid
from ...trust import distrust_above

#: The line in the front script that marks a file as a copy of this shim (never run as real).
MARKER = b"gpu-cache ptxas shim"
HERE = os.path.dirname(os.path.abspath(__file__))
SHIM_DIR = os.path.join(HERE, "bin")
FRONT = os.path.join(SHIM_DIR, "ptxas")
ENTRY_SUFFIX = ".ptxas"
IDENTITY_SUFFIX = ".identity"
ENTRY_MAGIC = b"gpu-cache ptxas entry 2\n"
IDENTITY_MAGIC = b"gpu-cache ptxas identity 1\n"
#: Inputs and entries larger than this are not cached (PTX of a big Triton kernel: about 1 MB).
MAX_BYTES = 256 << 20
#: What stands for the caller's input and output names in a kept stdout/stderr.
IN_MARK, OUT_MARK = b"\0gpu-cache-input\0", b"\0gpu-cache-output\0"
#: Names shorter than this are left as they are in a kept stderr (they could be part of words).
MIN_NAME = 8
#: Between the key parts of an entry's header and a tally line's ``meta`` field.
META_SEP = "\x1f"
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_READ_INPUT = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_NO_LINK = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS)

#: Options that take no value, and options that take one (``-x v`` or ``-x=v``), that change
#: nothing but the output and stderr: a call with any other option passes through.
FLAGS = frozenset((
    "-c", "--compile-only", "-g", "--device-debug", "-lineinfo", "--generate-line-info",
    "-v", "--verbose", "-w", "--disable-warnings", "-Werror", "--warning-as-error",
    "-warn-spills", "--warn-on-spills", "-warn-lmem-usage", "--warn-on-local-memory-usage",
    "-warn-double-usage", "--warn-on-double-precision-use", "-ewp", "--extensible-whole-program",
    "-preserve-relocs", "--preserve-relocs", "-ret-end", "--return-at-end", "-no-bb-merge",
    "--dont-merge-basicblocks", "-disable-optimizer-consts", "--disable-optimizer-constants",
    "-opt-fp-atomics", "--optimize-float-atomics", "-suppress-debug-info", "--suppress-debug-info",
    "-suppress-stack-size-warning", "--suppress-stack-size-warning",
))
VALUED = frozenset((
    "-arch", "--gpu-name", "-O", "--opt-level", "-m", "--machine", "-maxrregcount", "--maxrregcount",
    "-func-maxrregcount", "--device-function-maxrregcount", "-fmad", "--fmad", "-pic",
    "--position-independent-code", "-allow-expensive-optimizations", "--allow-expensive-optimizations",
    "-maxntid", "--maxntid", "-minnctapersm", "--minnctapersm", "-regUsageLevel",
    "--register-usage-level", "-Ofc", "--Ofast-compile", "-device-stack-protector",
    "--device-stack-protector",
))
OUTPUT = frozenset(("-o", "--output-file"))


class Pass(Exception):
    """This call passes through to the real ptxas, uncached (the text says why)."""


# --- the call --------------------------------------------------------------------------------

def parse(args):
    """``(input, output, options)`` of a call the cache can serve; ``options`` are the
    arguments with the two file names replaced by ``<input>`` and ``<output>`` (and ``-x=v``
    written ``-x v``). Raises Pass for any other call."""
    inputs, output, options = [], None, []
    at = 0
    while at < len(args):
        arg = args[at]
        at += 1
        name, equals, value = arg.partition("=")
        if arg in FLAGS or (arg[:2] == "-O" and arg[2:].isdigit()):
            options.append(arg)
        elif name in VALUED or name in OUTPUT:
            if not equals:
                if at >= len(args):
                    raise Pass(f"{name} without a value")
                value = args[at]
                at += 1
            if name in OUTPUT:
                if output is not None:
                    raise Pass("several outputs")
                output, value = value, "<output>"
            options += [name, value]
        elif arg.startswith("-") or not arg:
            raise Pass(f"option {arg[:60]!r}" if arg not in ("-", "") else "input from stdin")
        else:
            inputs.append(arg)
            options.append("<input>")
    if len(inputs) != 1:
        raise Pass("no input" if not inputs else "several inputs")
    if not output or output == inputs[0]:
        raise Pass("no output file" if not output else "output over its input")
    return inputs[0], output, options


def kernel_name(ptx):
    """The first entry function's name in PTX (what records and explain call the call)."""
    at = ptx.find(b".entry ")
    if at < 0:
        return "?"
    name = ptx[at + 7:at + 300].lstrip().split(b"(", 1)[0].split()[0:1]
    return name[0].decode("ascii", "replace") if name else "?"


# --- the real ptxas ----------------------------------------------------------------------------

def same_folder(a, b):
    """Whether two paths name one file or folder (by their names where they are missing)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.normpath(a) == os.path.normpath(b)


def is_shim(path):
    """Whether ``path`` is this shim, a copy of it, or reaches it through a link."""
    if same_folder(path, FRONT):
        return True
    try:
        fd = os.open(path, _READ)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and MARKER in os.read(fd, 4096)
    finally:
        os.close(fd)


def runnable(path):
    return bool(path) and os.path.isabs(path) and os.path.isfile(path) and os.access(path, os.X_OK)


def on_path(path_value, after=None):
    """The first ``ptxas`` on ``path_value`` that is not a shim; with ``after``, the first one
    after that folder (None where ``after`` is not on it). Relative entries are passed over."""
    entries = path_value.split(os.pathsep)
    if after is not None:
        at = next((i for i, entry in enumerate(entries) if entry and same_folder(entry, after)), None)
        if at is None:
            return None
        entries = entries[at + 1:]
    for entry in entries:
        candidate = os.path.join(entry, "ptxas")
        if os.path.isabs(entry) and runnable(candidate) and not is_shim(candidate):
            return candidate
    return None


def real_ptxas(environ):
    """The ptxas the caller would have run without the shim, or None."""
    found = on_path(environ.get("PATH", ""), after=SHIM_DIR)
    if found is not None or environ.get(NESTED_VAR):
        return found  # nested: never the named one, which may be the wrapper that called us
    named = environ.get(REAL_VAR, "")
    return named if runnable(named) and not is_shim(named) else None


#: Where jaxlib looks after PATH (tsl's CandidateCudaRoots), and JAX's CUDA wheels.
CUDA_ROOTS = ("/usr/local/cuda", "/opt/cuda")
WHEEL_ROOTS = (("nvidia", "cu13"), ("nvidia", "cuda_nvcc"))


def find_real(path_value, search_path):
    """``(the ptxas jaxlib runs without the shim, where it was found)``: the first on PATH,
    else the one of ``/usr/local/cuda``, ``/opt/cuda`` or a CUDA wheel on ``search_path``
    (sys.path), as jaxlib looks; (None, None) where there is none."""
    found = on_path(path_value)
    if found is not None:
        return found, "PATH"
    for root in CUDA_ROOTS:
        candidate = os.path.join(root, "bin", "ptxas")
        if runnable(candidate) and not is_shim(candidate):
            return candidate, root
    for entry in search_path:
        for parts in WHEEL_ROOTS:
            candidate = os.path.join(os.path.abspath(entry or "."), *parts, "bin", "ptxas")
            if runnable(candidate) and not is_shim(candidate):
                return candidate, "a CUDA wheel"
    return None, None


def version_line(version):
    """The line of ``ptxas --version`` that names the release (``... release 13.4, V13.4.59``)."""
    lines = [line for line in version.splitlines() if b"release" in line] or version.splitlines()[-1:]
    return lines[0].decode("utf-8", "replace").strip()[:200] if lines else "?"


def key_of(digest, version, options, ptx_digest):
    """The entry's key: the real ptxas (its file digest and version text), the options without
    file names, the input's digest."""
    key = sha256(b"gpu-cache ptxas key 1\0")
    for part in (digest.encode("ascii"), version, "\0".join(options).encode("utf-8", "surrogateescape")):
        key.update(part + b"\0\0")
    key.update(ptx_digest)
    return key.hexdigest()


# --- the cache folder ----------------------------------------------------------------------------

class Folder:
    """The cache folder, opened and checked by the trust rules (see the module's text)."""

    def __init__(self, path):
        self.path = path
        root = os.stat(os.path.dirname(path))
        # a team's root (shared_group mode): group-writable by a group of this user's
        team = team_gid(root)
        self.team = team if team is not None and (team == os.getegid() or team in os.getgroups()) else None
        why = distrust_above(path, self.team)  # the hook's rule for the folders above a cache
        if why:
            raise OSError(errno.EPERM, why)
        self.fd = os.open(path, _DIR)
        why = self.problem(self.fd, folder=True)
        if why:
            os.close(self.fd)
            raise OSError(errno.EPERM, f"{path} is {why}")

    def problem(self, fd, folder=False):
        """Why the folder or file open at ``fd`` breaks the trust rules, or None."""
        info = os.fstat(fd)
        if not (stat.S_ISDIR(info.st_mode) if folder else stat.S_ISREG(info.st_mode)):
            return "not a folder" if folder else "not a regular file"
        return owner_problem(info, self.team, where=fd)

    def read(self, name, magic):
        """The content after ``magic`` of the file ``name``; None where it is missing, breaks
        the rules or is not one of ours."""
        found = self.load(name)
        if found is None or found[2]:
            return None
        return found[0][len(magic):] if found[0].startswith(magic) else None

    def load(self, name):
        """``(content, stat, problem)`` of the file ``name``, or None where there is none (or it
        cannot be opened); ``problem``: why it may not be read (its content is then empty): not
        a regular file (a link, a FIFO: never followed nor waited on), another user's, over
        MAX_BYTES."""
        try:
            fd = os.open(name, _READ, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENXIO, errno.EOPNOTSUPP):  # a link, a socket
                return None
            try:
                return b"", os.lstat(name, dir_fd=self.fd), "not a regular file"
            except OSError:
                return None
        try:
            info = os.fstat(fd)
            why = self.problem(fd) or (f"over {MAX_BYTES} bytes" if info.st_size > MAX_BYTES else None)
            data = b"" if why else read_all(fd)
        finally:
            os.close(fd)
        if len(data) > MAX_BYTES:
            data, why = b"", f"over {MAX_BYTES} bytes"
        return data, info, why

    def set_aside(self, name, judged):
        """Set the file ``name`` (``judged``: its stat) aside, so the real ptxas's result takes
        its name; what the record says of it."""
        from ... import locks

        try:
            locks.set_aside(name, judged, dir_fd=self.fd)
        except OSError as exc:  # a read-only folder: refused again next time
            return f"; left in place ({exc.strerror or exc!r})"
        return "; set aside"

    def write(self, name, data):
        """Write ``name`` whole (a temporary file, then a link); whether it was placed (False:
        it exists already). Raises OSError."""
        tmp = f"{TMP_PREFIX}{os.uname().nodename[:60]}.{os.getpid()}.{os.urandom(6).hex()}"
        fd = os.open(tmp, _NEW, 0o600, dir_fd=self.fd)
        try:
            try:
                write_all(fd, data)
                os.fchmod(fd, 0o664 if self.team is not None else 0o644)
            finally:
                os.close(fd)
            return link_new(tmp, self.fd, name)
        finally:
            try:
                os.unlink(tmp, dir_fd=self.fd)
            except OSError:
                pass

    def touch(self, name):
        """Mark an entry used now (its last use, for prune); a read-only root leaves it."""
        try:
            os.utime(name, dir_fd=self.fd, follow_symlinks=False)
        except (OSError, NotImplementedError):
            pass


# link_new, read_all and write_all are tier.files' again, on purpose: the shim runs
# once per ptxas call (a hit costs about one Python start), and that module imports threading.
def link_new(tmp, folder_fd, name):
    """Give ``tmp`` the name ``name`` when that is free: a hard link (atomic, never over an
    entry), or where links fail a rename when the name is free. Whether it was placed."""
    try:
        os.link(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd, follow_symlinks=False)
        return True
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in _NO_LINK:
            raise
    try:
        os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
        return False
    except FileNotFoundError:
        os.rename(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
        return True


def read_all(fd, limit=MAX_BYTES):
    """What ``fd`` holds to its end, whatever ``fstat`` said of its size, or ``limit`` + 1
    bytes where it holds more (the caller refuses that)."""
    chunks, got = [], 0
    while got <= limit:
        chunk = os.read(fd, min(limit + 1 - got, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def write_all(fd, data):
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.EIO, "short write")
        view = view[written:]


# --- entries ------------------------------------------------------------------------------------

def pack_entry(key, stdout, stderr, output, seconds, meta):
    """An entry's bytes, framed with their digest (``digest``): magic, key, lengths
    and compile seconds, the key parts (for explain), then stdout, stderr and the output."""
    head = b"%s\n%d %d %d %.4f\n%s\n" % (key.encode("ascii"), len(stdout), len(stderr), len(output),
                                        seconds, clean(meta).encode("utf-8", "replace"))
    return frame.framed(ENTRY_MAGIC + head + stdout + stderr + output)


def unpack_entry(data, key):
    """``(stdout, stderr, output, seconds, meta)`` of the entry file ``data`` of ``key``.
    Raises ValueError, saying why it may not be served: not of this format (an older
    gpu-cache's), not as it was written (its digest), not whole, or another key's."""
    body = frame.opened(data)  # raises Damaged, a ValueError
    if body is None or not body.startswith(ENTRY_MAGIC):
        raise ValueError("not an entry of this format (an older gpu-cache's?)")
    try:
        named, sizes, meta, rest = body[len(ENTRY_MAGIC):].split(b"\n", 3)
        out_n, err_n, bin_n, seconds = sizes.split()
        out_n, err_n, bin_n, seconds = int(out_n), int(err_n), int(bin_n), float(seconds)
    except ValueError:
        raise ValueError("not whole (its header is cut short)") from None
    if named != key.encode("ascii"):
        raise ValueError("the entry of another key")
    if len(rest) != out_n + err_n + bin_n or bin_n == 0:
        raise ValueError("not whole (its sizes do not add up)")
    return (rest[:out_n], rest[out_n:out_n + err_n], rest[out_n + err_n:], seconds,
            meta.decode("utf-8", "replace"))


def clean(text, limit=2000):
    return str(text).replace("\t", " ").replace("\n", " ").replace("\r", " ")[:limit]


def keep_names(data, source, output):
    """A stdout/stderr to keep: the caller's file names replaced by marks."""
    for name, mark in sorted(((output, OUT_MARK), (source, IN_MARK)), key=lambda p: -len(p[0])):
        name = os.fsencode(name)
        if len(name) >= MIN_NAME:
            data = data.replace(name, mark)
    return data


def put_names(data, source, output):
    """A kept stdout/stderr with this caller's file names."""
    return data.replace(OUT_MARK, os.fsencode(output)).replace(IN_MARK, os.fsencode(source))


# --- a call -------------------------------------------------------------------------------------

def tally(outcome, key="", name="", seconds=0.0, saved=0.0, meta="", why=""):
    """One line for this call in ``$GPU_CACHE_PTXAS_TALLY`` (the hook reads it into the
    process's record); never raises."""
    path = os.environ.get(TALLY_VAR, "")
    if not os.path.isabs(path):
        return
    fields = (outcome, key, name, f"{seconds:.4f}", f"{saved:.4f}", meta, why)
    line = ("\t".join(clean(field, 1500) for field in fields) + "\n").encode("utf-8", "replace")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
    except OSError:
        pass


def real_environ():
    environ = dict(os.environ)
    environ[NESTED_VAR] = "1"
    return environ


def run_through(real, args, why, outcome="pass"):
    """Pass this call through to the real ptxas (this process becomes it)."""
    tally(outcome, why=why)
    os.execve(real, [real, *args], real_environ())


def serve(real, args, started):
    """Answer a call from the cache, or run the real ptxas once and keep its result. Returns
    the exit code; raises Pass before the real ptxas ran."""
    source, output, options = parse(args)
    folder_path = os.environ.get(CACHE_VAR, "")
    if not os.path.isabs(folder_path):
        raise Pass(f"{CACHE_VAR} is not an absolute folder")
    try:
        folder = Folder(folder_path)
    except OSError as exc:
        raise Pass(f"the cache folder cannot be used: {exc.strerror or exc}") from None
    ptx = read_input(source)
    from .identity import identity

    digest, version = identity(real, folder)
    ptx_digest = sha256(ptx).digest()
    key = key_of(digest, version, options, ptx_digest)
    name = kernel_name(ptx)
    meta = META_SEP.join((name, version_line(version), digest[:16], " ".join(options), ptx_digest.hex()[:16]))
    found = lookup(folder, key)
    if found is not None:
        replay(found, source, output)
        folder.touch(key + ENTRY_SUFFIX)
        spent = time.monotonic() - started
        tally("hit", key, name, spent, found[3] - spent, meta)
        return 0
    from .run import miss

    return miss(real, args, folder, key, meta, source, output, started, ptx_digest)


def read_input(source):
    """The whole input, read to its end. Raises Pass, before anything was read, where it is not
    a regular file (a pipe from ``<(...)`` or ``/dev/stdin``, a FIFO, a socket, a device: what
    the shim read there the real ptxas would not get) or is over MAX_BYTES."""
    try:
        info = os.stat(source)
    except OSError as exc:
        raise Pass(f"input: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise Pass("the input is not a regular file")
    fd = os.open(source, _READ_INPUT)  # without blocking, should it have become a FIFO since
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Pass("the input is not a regular file")
        ptx = read_all(fd)
    finally:
        os.close(fd)
    if len(ptx) > MAX_BYTES:
        raise Pass("input over 256 MiB")
    return ptx


def lookup(folder, key):
    """The entry of ``key`` (unpacked), or None: none there, or one that may not be served
    (:func:`unpack_entry`, :meth:`Folder.load`), which is set aside, so that the real ptxas's
    result takes its name, and counted as refused."""
    name = key + ENTRY_SUFFIX
    found = folder.load(name)
    if found is None:
        return None
    data, info, why = found
    if why is None:
        try:
            return unpack_entry(data, key)
        except ValueError as exc:
            why = str(exc)
    tally("refused", key, why=f"{key} is {why}{folder.set_aside(name, info)}")
    return None


def replay(entry, source, output):
    """A hit: the output byte for byte, then stdout and stderr as the real run wrote them."""
    stdout, stderr, binary = entry[0], entry[1], entry[2]
    fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    try:
        write_all(fd, binary)
    finally:
        os.close(fd)
    for stream, data in ((1, stdout), (2, stderr)):
        if data:
            write_all(stream, put_names(data, source, output))


def main():
    started = time.monotonic()
    args = sys.argv[1:]
    try:
        real = real_ptxas(os.environ)
    except Exception:
        real = None
    if real is None:
        os.write(2, f"gpu-cache ptxas shim: no real ptxas after the shim on PATH, nor in "
                    f"{REAL_VAR}\n".encode())
        os._exit(127)
    if os.environ.get(NESTED_VAR):
        run_through(real, args, "called from the real ptxas")
    try:
        code = serve(real, args, started)
    except Pass as why:
        run_through(real, args, str(why))
    except Exception as exc:  # the real ptxas has not run: it runs now, as without the shim
        run_through(real, args, f"shim error: {exc!r}")
    os._exit(code)
