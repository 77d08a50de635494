"""How gpu-cache speaks to a registry: plain HTTP only to this machine, on every hop, and a
deadline on everything it waits for.

requests has no deadline of its own: its timeouts bound each wait for the next bytes, so a
registry that sends one byte a second keeps a request going for as long as it likes (and one
that never answers kept ``fetch`` for the 300 s of the read timeout gpu-cache had). So every
exchange with a registry (its request, redirects, authentication and the body it reads) runs
in a thread of its own that the caller waits for until its deadline: the bound holds whatever
the registry does, headers and TLS included.
"""

from __future__ import annotations

import threading
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from gpu_cache.config.units import parse_age
from gpu_cache.core import names
from gpu_cache.core.errors import UsageError

from ._common import RegistryError, Unreachable

#: Hosts spoken to in plain HTTP: this machine only. Every other registry, and every hop a
#: redirect or a token service leads to, is HTTPS.
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
#: Seconds a registry has to accept a connection, and to send the next bytes of an answer
#: (:data:`gpu_cache.core.names.REGISTRY_TIMEOUT_VAR` sets another); also the whole budget
#: of the first request (``GET /v2/``).
TIMEOUT = 5.0
#: The deadline of one exchange: this many timeouts, plus a second for each MiB it moves.
FLOOR_TIMEOUTS = 6
SLOWEST_RATE = 1 << 20

T = TypeVar("T")


def timeout_of(environ: Mapping[str, str]) -> float:
    """The registry timeout the environment sets (default :data:`TIMEOUT`).

    Raises:
        UsageError: it is not a number of seconds above 0.
    """
    text = environ.get(names.REGISTRY_TIMEOUT_VAR)
    if not text:
        return TIMEOUT
    seconds = parse_age(text)
    if seconds <= 0:
        raise UsageError(f"{names.REGISTRY_TIMEOUT_VAR}={text!r}: give the seconds a registry may be silent")
    return seconds


def deadline(timeout: float, size: int = 0) -> float:
    """Seconds an exchange that moves ``size`` bytes may take."""
    return FLOOR_TIMEOUTS * timeout + size / SLOWEST_RATE


def is_local(url: str) -> bool:
    """Whether ``url`` (or ``//host:port``) names this machine."""
    return urllib.parse.urlsplit(url).hostname in LOCAL_HOSTS


def guard(session: Any, timeout: float) -> None:
    """Every request of ``session`` (a ``requests.Session``), each redirect's and token
    request's included, gets ``timeout`` to connect and for each read, and is refused before
    it is sent when it is plain HTTP to another machine (a registry on this machine that
    redirects its blobs to ``http://127.0.0.2``: #37)."""
    from requests.adapters import HTTPAdapter

    class _Guarded(HTTPAdapter):
        def send(self, request: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            parts = urllib.parse.urlsplit(request.url)
            if parts.scheme != "https" and not is_local(request.url):
                raise RegistryError(
                    f"the registry sent a request to {parts.scheme}://{parts.netloc}, which is plain "
                    "HTTP and not this machine: refused (plain HTTP is only for localhost, 127.0.0.1 "
                    "and [::1])"
                )
            kwargs["timeout"] = (timeout, timeout)
            return super().send(request, **kwargs)

    for prefix in ("http://", "https://"):
        session.mount(prefix, _Guarded())


def bounded(call: Callable[[threading.Event], T], seconds: float, late: str) -> T:
    """What ``call(stop)`` returns or raises, if it ends within ``seconds``; else
    :class:`Unreachable` (``late``, with the seconds). Then ``stop`` is set: a call that moves
    data ends at its next piece, and one that waits on the registry ends within a timeout; it
    is left to end in its own (daemon) thread."""
    stop = threading.Event()
    outcome: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            outcome.append((True, call(stop)))
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            outcome.append((False, exc))

    worker = threading.Thread(target=run, name="gpu-cache-registry", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive() or not outcome:
        stop.set()
        raise Unreachable(
            f"{late} within {round(seconds, 1):g} s ({names.REGISTRY_TIMEOUT_VAR} lets it take longer)"
        )
    finished, value = outcome[0]
    if not finished:
        raise value
    return value
