"""One registry, through oras-py's request and authentication calls (never its ``pull()``).

oras-py (``oras.provider.Registry``) gives the OCI distribution API's authentication: a
``Basic`` challenge (an htpasswd registry) through its basic backend, a ``Bearer`` one (Docker
Hub, GHCR, Harbor) through its token backend, anonymous tokens, docker's ``config.json`` with
its credential helpers. gpu-cache makes every request through ``do_request`` itself, without
oras-py's retry wrapper (five attempts with sleeps of up to 83 s: an unreachable registry
would hold the warm step for minutes), within a deadline and on guarded hops (``_transport``),
reads each body itself, and keeps the bytes of each manifest to check its digest
(``get_manifest`` returns parsed JSON, ``upload_manifest`` knows only image manifests,
``put_upload`` reads a whole layer into memory, ``pull()`` checks no digest and extracts
whatever a layer holds).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from gpu_cache.config.units import format_size
from gpu_cache.core import names, safe_io
from gpu_cache.core.errors import UsageError

from ._common import Refused, RegistryError, Unreachable, log
from ._transport import bounded, deadline, guard, is_local, timeout_of

#: Docker's own: the folder of its config.json (default ~/.docker).
DOCKER_CONFIG_VARIABLE = "DOCKER_CONFIG"

INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
#: Largest manifest, index or other answer read (a pack's manifest is a few KiB), and the
#: most of an error's answer read.
MAX_MANIFEST = 4 << 20
MAX_ERROR = 64 << 10
#: Bytes per upload request (a chunked upload: PATCH after PATCH, then PUT).
UPLOAD_CHUNK = 16 << 20
_PROGRESS_SECONDS = 5.0

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_HOST = rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REFERENCE = re.compile(
    rf"^(?P<host>{_HOST})/(?P<repo>{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9._-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")

#: Pages of a tag list read (each of up to 1000 tags).
MAX_TAG_PAGES = 100

T = TypeVar("T")


@dataclass(frozen=True)
class Answer:
    """What a registry answered: its status, headers (in any case), body and ``Link`` header."""

    status: int
    headers: Mapping[str, str]
    body: bytes
    links: Mapping[str, Any]


@dataclass(frozen=True)
class Reference:
    """``host[:port]/repository[:tag][@sha256:digest]``."""

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def name(self) -> str:
        return f"{self.registry}/{self.repository}"

    @property
    def target(self) -> str:
        """What the manifest request names: the digest where there is one, else the tag."""
        return self.digest or self.tag or "latest"

    def at(self, digest: str) -> str:
        return f"{self.name}@{digest}"

    def __str__(self) -> str:
        return self.name + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")


def parse_reference(text: str) -> Reference:
    """A reference as the user wrote it.

    Raises:
        UsageError: not ``host/repository[:tag][@sha256:...]`` (the host is required: no
            registry is assumed).
    """
    match = _REFERENCE.fullmatch(text)
    host = match.group("host") if match else ""
    if not match or not ("." in host or ":" in host or host.split(":")[0] == "localhost"):
        raise UsageError(
            f"{text!r} is not a registry reference: write HOST[:PORT]/REPOSITORY[:TAG] or "
            "HOST/REPOSITORY@sha256:DIGEST, e.g. registry.example.org/lab/af3-cache:2.6.2"
        )
    return Reference(host, match.group("repo"), match.group("tag"), match.group("digest"))


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Transfer:
    """A progress line every few seconds while a blob moves (oras-py has no callback)."""

    def __init__(self, what: str, total: int) -> None:
        self.what, self.total, self.done = what, total, 0
        self.next = time.monotonic() + _PROGRESS_SECONDS

    def step(self, size: int) -> None:
        self.done += size
        if time.monotonic() >= self.next:
            log.info("%s: %s of %s", self.what, format_size(self.done), format_size(self.total))
            self.next = time.monotonic() + _PROGRESS_SECONDS


def base_url(reference: Reference) -> str:
    """``http://`` for this machine's own registry, ``https://`` for every other."""
    return f"{'http' if is_local('//' + reference.registry) else 'https'}://{reference.registry}"


def _docker_config(environ: Mapping[str, str]) -> Path:
    folder = environ.get(DOCKER_CONFIG_VARIABLE)
    return (
        Path(folder) / "config.json"
        if folder
        else Path(environ.get("HOME") or Path.home()) / ".docker" / "config.json"
    )


class Session:
    """Requests to one repository of one registry, authenticated as its challenge asks.

    Raises (on creation):
        UsageError: oras-py is not installed, or the registry timeout is no number of seconds.
        Unreachable: the registry does not answer.
        RegistryError: it is no registry, or it asks for a login that is not configured.
    """

    def __init__(self, reference: Reference, environ: Mapping[str, str] | None = None) -> None:
        try:
            import oras.provider
            import requests
        except ImportError:
            raise UsageError(
                "registries need oras-py: pip install 'oras>=0.2.43,<0.3' (or gpu-cache's `registry` extra)"
            ) from None
        import urllib3

        self.requests = requests
        self.network_errors = (requests.RequestException, urllib3.exceptions.HTTPError)
        self.reference = reference
        self.base = base_url(reference)
        environ = os.environ if environ is None else environ
        self.timeout = timeout_of(environ)
        plain = self.base.startswith("http://")
        challenge = self._probe()
        self.basic = challenge.lower().startswith("basic")
        self.client = oras.provider.Registry(
            hostname=reference.registry, insecure=plain, auth_backend="basic" if self.basic else "token"
        )
        guard(self.client.session, self.timeout)
        self._login(challenge, environ)

    def _probe(self) -> str:
        """``GET /v2/`` once, all of it within the timeout: its authentication challenge ("" when
        it asks for none)."""
        requests = self.requests
        session = requests.Session()
        guard(session, self.timeout)

        def ask(stop: threading.Event) -> tuple[int, str]:
            try:
                with session.get(f"{self.base}/v2/", stream=True) as response:
                    return response.status_code, response.headers.get("Www-Authenticate", "")
            except requests.exceptions.SSLError as exc:
                raise RegistryError(
                    f"registry {self.reference.registry}: TLS failed ({_why(exc)}); a custom "
                    "CA goes in REQUESTS_CA_BUNDLE"
                ) from None
            except self.network_errors as exc:
                raise Unreachable(
                    f"registry {self.reference.registry} cannot be reached ({_why(exc)})"
                ) from None

        status, challenge = bounded(
            ask, self.timeout, f"registry {self.reference.registry} cannot be reached: no answer to GET /v2/"
        )
        if status == 401:
            return challenge
        if status != 200:
            raise RegistryError(f"{self.base}/v2/ answered HTTP {status}: not an OCI registry")
        return ""

    def _login(self, challenge: str, environ: Mapping[str, str]) -> None:
        user, password = environ.get(names.REGISTRY_USERNAME_VAR), environ.get(names.REGISTRY_PASSWORD_VAR)
        auth = self.client.auth
        if user and password:
            auth.set_basic_auth(user, password)
        else:
            config = _docker_config(environ)
            if config.is_file():
                container = self.client.get_container(f"{self.reference.repository}:x")
                try:  # a credential helper it names is a program that may wait: a deadline too
                    bounded(lambda stop: auth.load_configs(container, configs=[str(config)]),
                            deadline(self.timeout), f"reading the login in {config} did not end")
                except (OSError, ValueError, KeyError) as exc:
                    log.warning("registry credentials in %s not read: %s", config, _why(exc))
        if challenge and self.basic and not getattr(auth, "_basic_auth", None):
            raise RegistryError(
                f"registry {self.reference.registry} asks for a login: set {names.REGISTRY_USERNAME_VAR} "
                f"and {names.REGISTRY_PASSWORD_VAR}, or `docker login {self.reference.registry}`"
            )

    def exchange(
        self,
        method: str,
        path: str,
        read: Callable[[Any, threading.Event], T],
        *,
        ok: tuple[int, ...] = (200,),
        headers: Mapping[str, str] | None = None,
        data: bytes | None = None,
        moves: int = 0,
    ) -> T:
        """One request (``path`` below ``/v2/<repository>/``, or a whole URL) and what
        ``read(response, stop)`` makes of its answer, all within the deadline of moving ``moves``
        bytes (``_transport.deadline``).

        Raises:
            RegistryError: a status other than ``ok`` (with the registry's own message), or a
                hop in plain HTTP to another machine.
            Unreachable: the registry does not answer, or not within the deadline.
        """
        url = (
            path
            if path.startswith(("http://", "https://"))
            else f"{self.base}/v2/{self.reference.repository}/{path}"
        )
        sent = dict(headers or {})
        if self.basic:  # asked for on every request: send it at once (oras-py waits for the 401)
            sent.update(self.client.auth.get_auth_header())
        what = f"{method} {path.split('?')[0][:80]}"

        def run(stop: threading.Event) -> T:
            try:  # oras-py's do_request without its retry wrapper (see the module's docstring)
                with self.client.do_request.__wrapped__(
                    self.client, url, method, data=data, headers=sent, stream=True
                ) as response:
                    if response.status_code not in ok:
                        raise RegistryError(_failure(self.reference, what, response, stop))
                    return read(response, stop)
            except self.network_errors as exc:
                raise Unreachable(
                    f"registry {self.reference.registry}: {what} failed ({_why(exc)})"
                ) from None
            except ValueError as exc:  # oras-py: it cannot answer the authentication challenge
                raise RegistryError(f"registry {self.reference.registry}: {_why(exc)}") from None

        late = f"registry {self.reference.registry}: {what} did not end"
        return bounded(run, deadline(self.timeout, moves), late)

    def request(
        self,
        method: str,
        path: str,
        *,
        ok: tuple[int, ...] = (200,),
        headers: Mapping[str, str] | None = None,
        data: bytes | None = None,
        moves: int = 0,
    ) -> Answer:
        """:meth:`exchange` that reads the whole answer (at most :data:`MAX_MANIFEST` bytes)."""

        def read(response: Any, stop: threading.Event) -> Answer:
            body = b"".join(_limited(response, stop, MAX_MANIFEST, f"the answer to {method}"))
            return Answer(response.status_code, response.headers, body, response.links)

        return self.exchange(method, path, read, ok=ok, headers=headers, data=data, moves=moves)

    def manifest(
        self, target: str, accept: tuple[str, ...] = (INDEX_TYPE, MANIFEST_TYPE)
    ) -> tuple[bytes, str]:
        """The bytes of the manifest or index ``target`` (a tag or digest) and their digest,
        checked against ``target`` when it is one.

        Raises:
            Refused: the registry served other bytes than the digest names.
            RegistryError: no such manifest, or one larger than :data:`MAX_MANIFEST`.
        """
        found = self.manifest_if_any(target, accept)
        if found is None:
            raise RegistryError(f"{self.reference.name} has no manifest {target} (no such tag or digest)")
        return found

    def manifest_if_any(self, target: str, accept: tuple[str, ...] = (INDEX_TYPE, MANIFEST_TYPE)) -> (
            tuple[bytes, str] | None):
        """:meth:`manifest`, or None where the registry has none of that name."""

        def read(response: Any, stop: threading.Event) -> bytes | None:
            if response.status_code == 404:
                return None
            return b"".join(_limited(response, stop, MAX_MANIFEST, f"the manifest {target}"))

        raw = self.exchange(
            "GET", f"manifests/{target}", read, headers={"Accept": ", ".join(accept)}, ok=(200, 404)
        )
        if raw is None:
            return None
        digest = sha256_digest(raw)
        if DIGEST_RE.fullmatch(target) and digest != target:
            raise Refused(f"the registry served a manifest for {target} whose bytes hash to {digest}")
        return raw, digest

    def blob(self, digest: str, size: int, what: str) -> bytes:
        """A small blob's bytes, checked against its size and digest.

        Raises:
            Refused: they are not (damaged in the registry).
        """
        raw = self.exchange(
            "GET", f"blobs/{digest}", lambda r, stop: b"".join(_limited(r, stop, size, what)), moves=size
        )
        if len(raw) != size or sha256_digest(raw) != digest:
            raise Refused(
                f"{what} is damaged in the registry (its bytes are not {digest}, which its manifest names)"
            )
        return raw

    def download(self, digest: str, size: int, target: Path, what: str) -> None:
        """Stream blob ``digest`` into the new file ``target`` (0600), checking its size and
        SHA-256 on the way.

        Raises:
            Refused: its bytes are not ``digest``'s or ``size``'s (damaged in the registry).
        """

        def read(response: Any, stop: threading.Event) -> tuple[int, str]:
            hashing, progress = hashlib.sha256(), Transfer(f"fetch: {what}", size)
            fd = os.open(target, safe_io.CREATE_FLAGS, 0o600)
            with os.fdopen(fd, "wb") as out:
                for chunk in _limited(response, stop, size, f"{what} ({digest})"):
                    hashing.update(chunk)
                    out.write(chunk)
                    progress.step(len(chunk))
            return progress.done, "sha256:" + hashing.hexdigest()

        done, found = self.exchange("GET", f"blobs/{digest}", read, moves=size)
        if done != size or found != digest:
            raise Refused(
                f"{what} is damaged in the registry: {done} bytes whose SHA-256 is not "
                f"{digest}, which its manifest names"
            )

    def has_blob(self, digest: str) -> bool:
        return self.request("HEAD", f"blobs/{digest}", ok=(200, 404)).status == 200

    def upload(self, path: Path, digest: str, size: int, what: str) -> bool:
        """Upload the file at ``path`` as blob ``digest`` unless the registry has it; whether
        it was uploaded."""
        if self.has_blob(digest):
            return False
        location = self._location(self.request("POST", "blobs/uploads/", ok=(202,)))
        progress, start = Transfer(f"publish: {what}", size), 0
        for chunk in safe_io.iter_chunks(path, UPLOAD_CHUNK):
            answer = self.request(
                "PATCH",
                location,
                ok=(202,),
                data=chunk,
                headers={
                    "Content-Type": "application/octet-stream",
                    "Content-Range": f"{start}-{start + len(chunk) - 1}",
                },
                moves=len(chunk),
            )
            location, start = self._location(answer), start + len(chunk)
            progress.step(len(chunk))
        closing = location + ("&" if "?" in location else "?") + urllib.parse.urlencode({"digest": digest})
        self.request(  # the registry reads the whole blob to check its digest before it answers
            "PUT", closing, ok=(201,), data=b"", headers={"Content-Type": "application/octet-stream"},
            moves=size,
        )
        return True

    def _location(self, answer: Answer) -> str:
        """Where an upload goes on (its ``Location``), as a whole URL."""
        location = answer.headers.get("Location")
        if not location:
            raise RegistryError(f"registry {self.reference.registry} answered an upload without a Location")
        return self._absolute(location)

    def _absolute(self, location: str) -> str:
        return urllib.parse.urljoin(self.base + "/", location)

    def put_manifest(self, target: str, raw: bytes, media_type: str) -> None:
        self.request("PUT", f"manifests/{target}", ok=(201,), data=raw, headers={"Content-Type": media_type})

    def tags(self) -> list[str]:
        """Every tag of the repository (none when it does not exist yet), from at most
        :data:`MAX_TAG_PAGES` pages of the registry's list."""
        found: list[str] = []
        path = "tags/list?n=1000"
        for _ in range(MAX_TAG_PAGES):
            answer = self.request("GET", path, ok=(200, 404))
            if answer.status == 404:
                break
            try:
                listed = json.loads(answer.body).get("tags") or []
            except (ValueError, AttributeError):
                raise RegistryError(
                    f"registry {self.reference.registry}: its list of tags is not JSON"
                ) from None
            found += [t for t in listed if isinstance(t, str)] if isinstance(listed, list) else []
            link = answer.links.get("next", {}).get("url")
            if not link:
                break
            path = self._absolute(link)
        return found

    def delete(self, digest: str) -> None:
        """Delete the manifest ``digest`` (and so every tag that names it)."""
        if self.request("DELETE", f"manifests/{digest}", ok=(202, 405)).status == 405:
            raise RegistryError(
                f"registry {self.reference.registry} does not allow deleting (CNCF "
                "distribution: storage.delete.enabled: true)"
            )


def _pieces(response: Any, stop: threading.Event) -> Iterator[bytes]:
    """The body of ``response`` as it arrives, each piece what one read gave (so a registry
    that trickles is seen between pieces), until its end or ``stop``."""
    while not stop.is_set():
        piece = response.raw.read1(safe_io.CHUNK, decode_content=True)
        if not piece:
            return
        yield piece


def _limited(response: Any, stop: threading.Event, limit: int, what: str) -> Iterator[bytes]:
    """The body of ``response`` in pieces, refused past ``limit`` bytes."""
    seen = 0
    for piece in _pieces(response, stop):
        seen += len(piece)
        if seen > limit:
            raise Refused(f"{what} holds more than the {limit} bytes its manifest names")
        yield piece


def _why(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 200 else text[:197] + "..."


def _failure(reference: Reference, what: str, response: Any, stop: threading.Event) -> str:
    """The registry's own error (``{"errors": [{"code", "message"}]}``, from at most
    :data:`MAX_ERROR` bytes of its answer) in one line."""
    words = f"HTTP {response.status_code}"
    body = b""
    for piece in _pieces(response, stop):
        body += piece
        if len(body) >= MAX_ERROR:
            break
    try:
        errors = json.loads(body).get("errors") or []
        words += ": " + "; ".join(
            f"{e.get('code')} {e.get('message')}" for e in errors if isinstance(e, dict)
        )
    except (ValueError, AttributeError, TypeError):
        pass
    hint = ""
    if response.status_code in (401, 403):
        hint = (f" (check the login: {names.REGISTRY_USERNAME_VAR}/{names.REGISTRY_PASSWORD_VAR} or "
                "docker's config.json)")
    return f"{reference.name}: {what}: {words}{hint}"
