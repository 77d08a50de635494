"""The digest frame around the entries the startup hook serves itself (issue 38): the hook's
copy (``_hook/gpu_cache_hook/digest.py``, which the ptxas shim and the jax-triton store use) and
the package's (``core/digest.py``, which stats, prune, doctor --fix and pack use) are one
format: each reads what the other writes, and both refuse the same damage."""

from __future__ import annotations

import pytest

from gpu_cache.core import digest as core
from helpers import hook_piece

PAYLOADS = [b"", b"x", b"gpu-cache ptxas entry 2\n" + bytes(range(256)) * 300, b"{\"format\": 3}\n"]


@pytest.fixture(scope="module")
def hook():
    return hook_piece("digest")


def test_the_hook_and_the_package_frame_alike(hook):
    assert (hook.MAGIC, hook.LINE, hook.DAMAGED) == (core.MAGIC, core.LINE, core.DAMAGED)
    for payload in PAYLOADS:
        framed = hook.framed(payload)
        assert core.framed(payload) == framed
        assert framed.startswith(core.MAGIC) and framed[core.LINE - 1:core.LINE] == b"\n"
        assert hook.opened(framed) == core.opened(framed) == payload


@pytest.mark.parametrize("where", ["the payload's first byte", "the payload's last byte", "the digest",
                                   "one byte more", "one byte less"])
def test_both_refuse_one_changed_byte(hook, where):
    framed = bytearray(hook.framed(PAYLOADS[2]))
    if where == "one byte more":
        framed += b"\0"
    elif where == "one byte less":
        del framed[-1]
    elif where == "the digest":  # another hex digit
        at = len(core.MAGIC) + 10
        framed[at] = ord("0") if framed[at] != ord("0") else ord("1")
    else:
        framed[core.LINE if where == "the payload's first byte" else -1] ^= 1
    for copy in (hook, core):
        with pytest.raises(copy.Damaged, match=r"its sha256 differs"):
            copy.opened(bytes(framed))


@pytest.mark.parametrize("data", [b"", b"gpu-cache ptxas entry 1\nkey\n0 0 5 1.0\nmeta\ncubin",
                                  b'{"format": 2, "sha256": "00"}', core.MAGIC + b"0" * 64,
                                  core.MAGIC + b"0" * 64 + b" payload"])
def test_what_is_not_framed_is_another_format_for_both(hook, data):
    assert hook.opened(data) is None and core.opened(data) is None
