"""gpu-cache's startup hook: an entry framed with the digest of its payload (issue 38), for
the entries the hook serves itself: the ptxas shim's (``kinds.ptxas.shim``) and the jax-triton
store's (``kinds.jax_triton.store``).

A framed entry is one line, ``gpu-cache sha256 <64 hex digits>``, then the payload whose
sha256 that is. The digest is written with the entry and checked on every read, so damage that
keeps the size and the times (bit rot, a write in place, one flipped bit) is found before the
entry is served. Its one home: the host side (stats, prune, doctor --fix, pack) imports this
module too, so it imports nothing but the standard library. Standard library only, Python 3.9+.
"""

try:  # the bare module: hashlib would add its OpenSSL binding to every ptxas call's start
    from _sha256 import sha256
except ImportError:
    try:
        from _sha2 import sha256
    except ImportError:
        from hashlib import sha256

MAGIC = b"gpu-cache sha256 "
#: The frame's line: MAGIC, 64 hex digits, a newline.
LINE = len(MAGIC) + 65
#: What a reader says of a framed entry whose payload is not the one its digest names.
DAMAGED = "not as it was written (its sha256 differs)"


class Damaged(ValueError):
    """Framed, but the payload is not the one its digest names."""


def framed(payload):
    """``payload`` (bytes) framed with its digest: what is written as the entry."""
    return MAGIC + sha256(payload).hexdigest().encode("ascii") + b"\n" + payload


def opened(data):
    """The payload of the framed entry ``data``; None where ``data`` is not framed (another
    format: an entry of an older gpu-cache). Raises Damaged where the payload is not the one
    its digest names."""
    if len(data) < LINE or not data.startswith(MAGIC) or data[LINE - 1:LINE] != b"\n":
        return None
    if sha256(memoryview(data)[LINE:]).hexdigest().encode("ascii") != data[len(MAGIC):LINE - 1]:
        raise Damaged(DAMAGED)
    return data[LINE:]
