"""The digest frame around the entries the startup hook serves itself (issue 38) has one home,
the hook's ``_hook/gpu_cache_hook/digest.py``: the ptxas shim and the jax-triton store write
and check it there, and stats, prune, doctor --fix and pack import that same module (it
imports nothing but the standard library)."""

from __future__ import annotations

import pytest

from gpu_cache._hook.gpu_cache_hook import digest
from helpers import hook_piece

PAYLOADS = [b"", b"x", b"gpu-cache ptxas entry 2\n" + bytes(range(256)) * 300, b"{\"format\": 3}\n"]


def test_the_host_reads_with_the_module_the_hook_runs():
    assert digest.__file__ == hook_piece("digest").__file__
    for payload in PAYLOADS:
        framed = digest.framed(payload)
        assert framed.startswith(digest.MAGIC) and framed[digest.LINE - 1:digest.LINE] == b"\n"
        assert digest.opened(framed) == payload


@pytest.mark.parametrize("where", ["the payload's first byte", "the payload's last byte", "the digest",
                                   "one byte more", "one byte less"])
def test_one_changed_byte_is_refused(where):
    framed = bytearray(digest.framed(PAYLOADS[2]))
    if where == "one byte more":
        framed += b"\0"
    elif where == "one byte less":
        del framed[-1]
    elif where == "the digest":  # another hex digit
        at = len(digest.MAGIC) + 10
        framed[at] = ord("0") if framed[at] != ord("0") else ord("1")
    else:
        framed[digest.LINE if where == "the payload's first byte" else -1] ^= 1
    with pytest.raises(digest.Damaged, match=r"its sha256 differs"):
        digest.opened(bytes(framed))


@pytest.mark.parametrize("data", [b"", b"gpu-cache ptxas entry 1\nkey\n0 0 5 1.0\nmeta\ncubin",
                                  b'{"format": 2, "sha256": "00"}', digest.MAGIC + b"0" * 64,
                                  digest.MAGIC + b"0" * 64 + b" payload"])
def test_what_is_not_framed_is_another_format(data):
    assert digest.opened(data) is None
