"""Entries framed with the digest of their payload (issue 38): the ptxas shim's and the
jax-triton store's, which the startup hook writes and checks before it serves one
(``_hook/gpu_cache_hook/digest.py``, the format's other copy: the hook imports nothing of the
package; ``tests/test_digest.py`` keeps the two one).

A framed entry is one line, ``gpu-cache sha256 <64 hex digits>``, then the payload whose
sha256 that is: damage that keeps an entry's size and times is found by ``prune`` and
``doctor --fix``, which remove the entry as broken. Pure standard library.
"""

from __future__ import annotations

import hashlib

MAGIC = b"gpu-cache sha256 "
#: The frame's line: MAGIC, 64 hex digits, a newline.
LINE = len(MAGIC) + 65
#: What a scan says of a framed entry whose payload is not the one its digest names.
DAMAGED = "not as it was written (its sha256 differs)"


class Damaged(ValueError):
    """Framed, but the payload is not the one its digest names."""


def framed(payload: bytes) -> bytes:
    """``payload`` framed with its digest, as the hook writes an entry."""
    return MAGIC + hashlib.sha256(payload).hexdigest().encode("ascii") + b"\n" + payload


def opened(data: bytes) -> bytes | None:
    """The payload of the framed entry ``data``; None where it is not framed (another format).

    Raises:
        Damaged: the payload is not the one its digest names.
    """
    if len(data) < LINE or not data.startswith(MAGIC) or data[LINE - 1:LINE] != b"\n":
        return None
    if hashlib.sha256(memoryview(data)[LINE:]).hexdigest().encode("ascii") != data[len(MAGIC):LINE - 1]:
        raise Damaged(DAMAGED)
    return data[LINE:]
