"""Numba's files checked whole without running any of them: an index (``.nbi``) is two pickles
back to back (numba's version, then ``(source stamp, overloads)``: ``IndexDataCacheFile``'s
``_save_index`` in ``numba/core/caching.py``), a data file (``.nbc``) one pickle. Both are
walked opcode by opcode with :func:`pickletools.genops`, which builds no object and imports
nothing, so a file another user planted is read as safely as the user's own: a file cut short
or emptied is not whole. (Bytes flipped inside a pickle's data keep its shape: the seals find
those, ``integrity``; bytes after the last pickle numba ignores, and so does this.)
"""

from __future__ import annotations

import os
import pickletools
import struct

from gpu_cache.core import safe_io, verified

#: How many pickles each of numba's files holds, by its suffix.
PICKLES = {".nbi": 2, ".nbc": 1}
#: A file larger than this is not walked (genops holds each argument whole in memory): a
#: numba data file is the object code of one function, kilobytes to a few megabytes.
WALK_LIMIT = 1 << 30


def problem(path: str, relative: str, info: os.stat_result, record: verified.Record | None) -> str | None:
    """Why numba's file ``path`` (``relative``: its path in the kind folder; ``info``: its
    ``lstat``) is not whole, or None; a file ``record`` saw whole in this state is not read
    again, and one found whole is recorded so."""
    pickles = PICKLES[os.path.splitext(path)[1]]
    if info.st_size == 0:
        return "empty (its writer was killed, or the disk was full)"
    digest = verified.digest(5, verified.text(relative), info.st_ino, info.st_size, info.st_mtime_ns)
    if record is not None and record.get(digest) is not None:
        return None
    if info.st_size > WALK_LIMIT:
        return None
    why = _walk(path, info, pickles)
    if why is None and record is not None:
        record.put(digest, 1)
    return why


def _walk(path: str, info: os.stat_result, pickles: int) -> str | None:
    fd = safe_io.open_to_check(path, info)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as stream:
        for number in range(1, pickles + 1):
            try:
                for _opcode, _argument, _position in pickletools.genops(stream):
                    pass
            except (ValueError, EOFError, struct.error) as exc:
                which = f"pickle {number} of {pickles}" if pickles > 1 else "its pickle"
                return f"not whole: {which} ends early or is damaged ({exc})"
    return None
