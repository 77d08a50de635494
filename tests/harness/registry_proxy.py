"""A small HTTP proxy in front of a real registry that misbehaves on purpose: for the requests
a test names, it never answers, sends the answer a few bytes at a time, redirects elsewhere, or
answers with words of its own; every other request goes to the registry unchanged.

It runs in the test's process (a thread per connection, standard library only). Usage::

    with RegistryProxy(server.host) as proxy:
        proxy.stall(lambda method, path: "/manifests/" in path)
        ref = f"{proxy.host}/lab/cache:1"   # gpu-cache speaks to the proxy
        ...
        proxy.seen                          # (method, path) of every request it got
"""

from __future__ import annotations

import http.client
import http.server
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

Match = Callable[[str, str], bool]

#: Headers that belong to one connection, not to the answer passed on.
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


@dataclass(frozen=True)
class _Fault:
    match: Match
    what: str  # "stall", "trickle", "redirect" or "answer"
    interval: float = 0.0
    chunk: int = 1
    to: str = ""
    status: int = 0
    body: bytes = b""


class RegistryProxy:
    """A proxy on ``host`` (an address of this machine; port chosen free) to ``upstream``
    (``127.0.0.1:PORT``)."""

    def __init__(self, upstream: str, host: str = "127.0.0.1") -> None:
        self.upstream = upstream
        self.address = host
        self.faults: list[_Fault] = []
        self.seen: list[tuple[str, str]] = []
        self.released = threading.Event()  # set at stop: every stalled answer ends
        self.server: http.server.ThreadingHTTPServer | None = None

    @property
    def host(self) -> str:
        assert self.server is not None
        return f"{self.address}:{self.server.server_address[1]}"

    def stall(self, match: Match) -> None:
        """Read the request, then never answer."""
        self.faults.append(_Fault(match, "stall"))

    def trickle(self, match: Match, interval: float, chunk: int = 1) -> None:
        """The registry's answer, its body ``chunk`` bytes each ``interval`` seconds."""
        self.faults.append(_Fault(match, "trickle", interval=interval, chunk=chunk))

    def redirect(self, match: Match, to: str) -> None:
        """A ``307`` to the same path at ``to`` (``http://127.0.0.2:PORT``)."""
        self.faults.append(_Fault(match, "redirect", to=to))

    def answer(self, match: Match, status: int, body: bytes) -> None:
        """``status`` with ``body`` (JSON) instead of the registry's answer."""
        self.faults.append(_Fault(match, "answer", status=status, body=body))

    def fault(self, method: str, path: str) -> _Fault | None:
        return next((f for f in self.faults if f.match(method, path)), None)

    def start(self) -> RegistryProxy:
        server = http.server.ThreadingHTTPServer((self.address, 0), _Handler)
        server.daemon_threads, server.block_on_close = True, False
        server.proxy = self  # type: ignore[attr-defined]
        self.server = server
        threading.Thread(target=server.serve_forever, name="registry-proxy", daemon=True).start()
        return self

    def stop(self) -> None:
        self.released.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def __enter__(self) -> RegistryProxy:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # one request per connection: a stalled one holds nothing else

    def log_message(self, format: str, *args: object) -> None:  # quiet: the tests read `seen`
        pass

    def _handle(self) -> None:
        proxy: RegistryProxy = self.server.proxy  # type: ignore[attr-defined]
        proxy.seen.append((self.command, self.path))
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        fault = proxy.fault(self.command, self.path)
        try:
            if fault is not None and fault.what == "stall":
                proxy.released.wait()
            elif fault is not None and fault.what == "redirect":
                self._send(307, {"Location": fault.to + self.path}, b"")
            elif fault is not None and fault.what == "answer":
                self._send(fault.status, {"Content-Type": "application/json"}, fault.body)
            else:
                self._forward(proxy, body, fault)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up: what the tests want it to do

    do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _handle

    def _forward(self, proxy: RegistryProxy, body: bytes, fault: _Fault | None) -> None:
        upstream = http.client.HTTPConnection(proxy.upstream, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS}
            upstream.request(self.command, self.path, body=body or None, headers=headers)
            response = upstream.getresponse()
            data = response.read()
            kept = {k: v for k, v in response.getheaders() if k.lower() not in _HOP_HEADERS}
        finally:
            upstream.close()
        if self.command == "HEAD":  # the size of what a GET would send, and no body
            self._send(response.status, kept, b"", length=int(response.getheader("Content-Length") or 0))
            return
        if fault is None:
            self._send(response.status, kept, data)
            return
        self._send(response.status, kept, b"", length=len(data))
        for start in range(0, len(data), fault.chunk):  # a trickle
            self.wfile.write(data[start : start + fault.chunk])
            self.wfile.flush()
            if proxy.released.wait(fault.interval):
                return

    def _send(self, status: int, headers: dict[str, str], data: bytes, length: int | None = None) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data) if length is None else length))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
