"""gpu-cache's startup hook, torch extensions: what a build's flags hold beyond their own text.

GCC, Clang and the linker take an argument ``@file`` as the arguments written in that file (a
response file; one may name others), and nvcc reads its own from ``--options-file`` (``-optf``).
So the flags a build is made with are the files' contents too: the key holds each file's
digest (another file, another key), and a flag that builds for the CPU the compiler runs on
(:data:`NATIVE`) counts wherever it is written, in a file too. A file is named by an argument of
any flag list, or by an item of what nvcc and the compiler driver pass on (``-Xcompiler @f``,
``-Xcompiler=@f,-O2``, ``-Wl,@f``); a relative name is the build folder's, where the compiler
runs, as GCC reads it. A file that cannot be read raises OSError: the build then goes as
without the hook (the compiler reads such an argument as a file name, and fails as it would).
Standard library only, Python 3.9+.
"""

import errno
import hashlib
import json
import os
import shlex
import stat

#: Flags that build for the CPU the compiler runs on (in any flag list: nvcc's -Xcompiler, -flto's
#: link): the key holds the macros they define here (AVX2...), or an older CPU loads code it cannot run.
NATIVE = ("-march=native", "-mcpu=native", "-mtune=native")
#: nvcc's options that name a file of options (its value: the next argument, or after ``=``).
OPTIONS_FILE = ("--options-file", "-optf")
#: Options whose value nvcc or the driver passes on as a comma-separated list (``-Xcompiler
#: a,b``'s value is an argument of its own, split the same way).
PASSED_ON = ("-Wl,", "-Xcompiler=", "--compiler-options=", "-Xlinker=", "--linker-options=")
#: Most response files one build reads (one that names itself would never end), and most bytes
#: read of one.
MOST_FILES = 256
FILE_LIMIT = 1 << 20


def expand(lists, folder):
    """``(arguments, files)`` of the flag ``lists``: every argument, those of the response files
    they name in place after the one that names each; and ``[[name as written, sha256], ...]``
    of those files, in the order they are named. ``folder``: where the compiler runs. Raises
    OSError: a file cannot be read, is not a regular file, is too large or not one argument
    list (unbalanced quotes), or too many are named."""
    out, files = [], []
    pending = [str(flag) for flags in lists for flag in flags or ()]
    pending.reverse()
    after_option = False
    while pending:
        argument = pending.pop()
        out.append(argument)
        named = [argument] if after_option else _named(argument)
        after_option = argument in OPTIONS_FILE
        for name in named:
            if len(files) >= MOST_FILES:
                raise OSError(errno.ELOOP, f"more than {MOST_FILES} response files")
            data = _read(os.path.join(folder, name))
            files.append([name, hashlib.sha256(data).hexdigest()])
            try:
                inside = shlex.split(data.decode("utf-8", "surrogateescape"))
            except ValueError as exc:
                raise OSError(errno.EINVAL, f"the response file {name} is no argument list ({exc})") from None
            pending.extend(reversed(inside))
    return out, files


def parts(lists, folder, macros, length):
    """The key parts of what the flag ``lists`` hold beyond their text, each only where they
    hold it (so that other keys stay): ``responses``, the response files' digests (:func:`expand`;
    ``folder``: where the compiler runs), and ``native``, a digest (``length`` hex digits) of
    what ``macros(flags)`` says the compiler defines with the :data:`NATIVE` flags found. And
    the paths of the response files. Raises OSError: as :func:`expand`, or the compiler says
    nothing."""
    arguments, files = expand(lists, folder)
    found = {"responses": json.dumps(files)} if files else {}
    native = tuple(flag for flag in NATIVE if any(flag in argument for argument in arguments))
    if native:
        said = macros(native)
        if not said:
            raise OSError(errno.EINVAL, f"the compiler says nothing of {' '.join(native)}")
        found["native"] = hashlib.sha256("\n".join(sorted(said.splitlines())).encode()).hexdigest()[:length]
    return found, [os.path.join(folder, name) for name, _digest in files]


def _named(argument):
    """The files one argument names: ``@file``; an item ``@file`` of what it passes on; the
    value of ``--options-file=file``."""
    for option in OPTIONS_FILE:
        if argument.startswith(f"{option}="):
            return [argument[len(option) + 1:]]
    items = argument.split(",")
    for prefix in PASSED_ON:
        if argument.startswith(prefix):
            items = argument[len(prefix):].split(",")
    return [item[1:] for item in items if item[:1] == "@" and len(item) > 1]


def _read(path):
    """The bytes of the regular file ``path`` (at most FILE_LIMIT), never blocking on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot read the response file {path} ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, f"the response file {path} is not a regular file")
        chunks, size = [], 0
        while size <= FILE_LIMIT:
            chunk = os.read(fd, FILE_LIMIT + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > FILE_LIMIT:
        raise OSError(errno.EFBIG, f"the response file {path} is larger than the 1 MiB read of one")
    return b"".join(chunks)
