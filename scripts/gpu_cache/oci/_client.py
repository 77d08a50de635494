"""One registry, through oras-py's request and authentication calls (never its ``pull()``).

oras-py (``oras.provider.Registry``) gives the OCI distribution API's authentication: a
``Basic`` challenge (an htpasswd registry) through its basic backend, a ``Bearer`` one (Docker
Hub, GHCR, Harbor) through its token backend, anonymous tokens, docker's ``config.json`` with
its credential helpers. gpu-cache makes every request through ``do_request`` itself, without
oras-py's retry wrapper (five attempts with sleeps of up to 83 s: an unreachable registry
would hold the warm step for minutes), with a timeout on each request, and keeps the bytes of
each manifest to check its digest (``get_manifest`` returns parsed JSON, ``upload_manifest``
knows only image manifests, ``put_upload`` reads a whole layer into memory, ``pull()`` checks
no digest and extracts whatever a layer holds).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_cache.config.units import format_size
from gpu_cache.core import safe_io
from gpu_cache.core.errors import UsageError

from ._common import Refused, RegistryError, Unreachable, log

#: The registry login, from the environment (they win over docker's config.json).
USERNAME_VARIABLE = "GPU_CACHE_REGISTRY_USERNAME"
PASSWORD_VARIABLE = "GPU_CACHE_REGISTRY_PASSWORD"
#: Docker's own: the folder of its config.json (default ~/.docker).
DOCKER_CONFIG_VARIABLE = "DOCKER_CONFIG"

INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
#: Largest manifest or index read (a pack's manifest is a few KiB).
MAX_MANIFEST = 4 << 20
#: Hosts spoken to in plain HTTP: this machine only. Every other registry is HTTPS.
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]"})
#: Seconds to connect (also the probe's whole budget), and to wait for each read.
CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 300.0
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
    registry = reference.registry
    host = registry[: registry.index("]") + 1] if registry.startswith("[") else registry.split(":")[0]
    return f"{'http' if host in LOCAL_HOSTS else 'https'}://{registry}"


def _docker_config(environ: Mapping[str, str]) -> Path:
    folder = environ.get(DOCKER_CONFIG_VARIABLE)
    return (
        Path(folder) / "config.json"
        if folder
        else Path(environ.get("HOME") or Path.home()) / ".docker" / "config.json"
    )


def _timeouts(session: Any) -> None:
    """Every request of ``session`` gets a connect and a read timeout (requests has none by
    default: a registry that stops answering would hang the run)."""
    from requests.adapters import HTTPAdapter

    class _Timed(HTTPAdapter):
        def send(self, request: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            kwargs["timeout"] = kwargs.get("timeout") or (CONNECT_TIMEOUT, READ_TIMEOUT)
            return super().send(request, **kwargs)

    for prefix in ("http://", "https://"):
        session.mount(prefix, _Timed())


class Session:
    """Requests to one repository of one registry, authenticated as its challenge asks.

    Raises (on creation):
        UsageError: oras-py is not installed.
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
        self.requests = requests
        self.reference = reference
        self.base = base_url(reference)
        plain = self.base.startswith("http://")
        challenge = self._probe()
        self.basic = challenge.lower().startswith("basic")
        self.client = oras.provider.Registry(
            hostname=reference.registry, insecure=plain, auth_backend="basic" if self.basic else "token"
        )
        _timeouts(self.client.session)
        self._login(challenge, os.environ if environ is None else environ)

    def _probe(self) -> str:
        """``GET /v2/`` once, within :data:`CONNECT_TIMEOUT`: its authentication challenge
        ("" when it asks for none)."""
        requests = self.requests
        try:
            response = requests.get(f"{self.base}/v2/", timeout=CONNECT_TIMEOUT)
        except requests.exceptions.SSLError as exc:
            raise RegistryError(
                f"registry {self.reference.registry}: TLS failed ({_why(exc)}); a custom "
                "CA goes in REQUESTS_CA_BUNDLE"
            ) from None
        except requests.RequestException as exc:
            raise Unreachable(f"registry {self.reference.registry} cannot be reached ({_why(exc)})") from None
        if response.status_code == 401:
            return response.headers.get("Www-Authenticate", "")
        if response.status_code != 200:
            raise RegistryError(f"{self.base}/v2/ answered HTTP {response.status_code}: not an OCI registry")
        return ""

    def _login(self, challenge: str, environ: Mapping[str, str]) -> None:
        user, password = environ.get(USERNAME_VARIABLE), environ.get(PASSWORD_VARIABLE)
        auth = self.client.auth
        if user and password:
            auth.set_basic_auth(user, password)
        else:
            config = _docker_config(environ)
            if config.is_file():
                try:
                    auth.load_configs(
                        self.client.get_container(f"{self.reference.repository}:x"), configs=[str(config)]
                    )
                except (OSError, ValueError, KeyError) as exc:
                    log.warning("registry credentials in %s not read: %s", config, _why(exc))
        if challenge and self.basic and not getattr(auth, "_basic_auth", None):
            raise RegistryError(
                f"registry {self.reference.registry} asks for a login: set {USERNAME_VARIABLE} "
                f"and {PASSWORD_VARIABLE}, or `docker login {self.reference.registry}`"
            )

    def request(
        self,
        method: str,
        path: str,
        *,
        ok: tuple[int, ...] = (200,),
        headers: Mapping[str, str] | None = None,
        data: bytes | None = None,
        stream: bool = False,
    ) -> Any:
        """One request (``path`` below ``/v2/<repository>/``, or a whole URL); a status other
        than ``ok`` raises :class:`RegistryError` with the registry's own message."""
        url = (
            path
            if path.startswith(("http://", "https://"))
            else f"{self.base}/v2/{self.reference.repository}/{path}"
        )
        sent = dict(headers or {})
        if self.basic:  # asked for on every request: send it at once (oras-py waits for the 401)
            sent.update(self.client.auth.get_auth_header())
        try:  # oras-py's do_request without its retry wrapper (see the module's docstring)
            response = self.client.do_request.__wrapped__(
                self.client, url, method, data=data, headers=sent, stream=stream
            )
        except self.requests.RequestException as exc:
            raise Unreachable(f"registry {self.reference.registry}: {method} failed ({_why(exc)})") from None
        except ValueError as exc:  # oras-py: it cannot answer the authentication challenge
            raise RegistryError(f"registry {self.reference.registry}: {_why(exc)}") from None
        if response.status_code not in ok:
            raise RegistryError(_failure(self.reference, method, path, response))
        return response

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
        response = self.request(
            "GET", f"manifests/{target}", headers={"Accept": ", ".join(accept)}, stream=True, ok=(200, 404)
        )
        if response.status_code == 404:
            return None
        raw = b"".join(_limited(response, MAX_MANIFEST, f"the manifest {target}"))
        digest = sha256_digest(raw)
        if DIGEST_RE.fullmatch(target) and digest != target:
            raise Refused(f"the registry served a manifest for {target} whose bytes hash to {digest}")
        return raw, digest

    def blob(self, digest: str, size: int, what: str) -> bytes:
        """A small blob's bytes, checked against its size and digest.

        Raises:
            Refused: they are not (damaged in the registry).
        """
        raw = b"".join(_limited(self.request("GET", f"blobs/{digest}", stream=True), size, what))
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
        response = self.request("GET", f"blobs/{digest}", stream=True)
        hashing, progress = hashlib.sha256(), Transfer(f"fetch: {what}", size)
        fd = os.open(target, safe_io.CREATE_FLAGS, 0o600)
        with os.fdopen(fd, "wb") as out:
            for chunk in _limited(response, size, f"{what} ({digest})"):
                hashing.update(chunk)
                out.write(chunk)
                progress.step(len(chunk))
        if progress.done != size or "sha256:" + hashing.hexdigest() != digest:
            raise Refused(
                f"{what} is damaged in the registry: {progress.done} bytes whose SHA-256 is not "
                f"{digest}, which its manifest names"
            )

    def has_blob(self, digest: str) -> bool:
        return self.request("HEAD", f"blobs/{digest}", ok=(200, 404)).status_code == 200

    def upload(self, path: Path, digest: str, size: int, what: str) -> bool:
        """Upload the file at ``path`` as blob ``digest`` unless the registry has it; whether
        it was uploaded."""
        if self.has_blob(digest):
            return False
        location = self.request("POST", "blobs/uploads/", ok=(202,)).headers["Location"]
        progress, start = Transfer(f"publish: {what}", size), 0
        for chunk in safe_io.iter_chunks(path, UPLOAD_CHUNK):
            response = self.request(
                "PATCH",
                self._absolute(location),
                ok=(202,),
                data=chunk,
                headers={
                    "Content-Type": "application/octet-stream",
                    "Content-Range": f"{start}-{start + len(chunk) - 1}",
                },
            )
            location, start = response.headers["Location"], start + len(chunk)
            progress.step(len(chunk))
        closing = self._absolute(location)
        closing += ("&" if "?" in closing else "?") + urllib.parse.urlencode({"digest": digest})
        self.request(
            "PUT", closing, ok=(201,), data=b"", headers={"Content-Type": "application/octet-stream"}
        )
        return True

    def _absolute(self, location: str) -> str:
        return urllib.parse.urljoin(self.base + "/", location)

    def put_manifest(self, target: str, raw: bytes, media_type: str) -> None:
        self.request("PUT", f"manifests/{target}", ok=(201,), data=raw, headers={"Content-Type": media_type})

    def tags(self) -> list[str]:
        """Every tag of the repository (none when it does not exist yet)."""
        found: list[str] = []
        path = "tags/list?n=1000"
        while path:
            response = self.request("GET", path, ok=(200, 404))
            if response.status_code == 404:
                return found
            found += [t for t in (response.json().get("tags") or []) if isinstance(t, str)]
            link = response.links.get("next", {}).get("url")
            path = self._absolute(link) if link else ""
        return found

    def delete(self, digest: str) -> None:
        """Delete the manifest ``digest`` (and so every tag that names it)."""
        response = self.request("DELETE", f"manifests/{digest}", ok=(202, 405))
        if response.status_code == 405:
            raise RegistryError(
                f"registry {self.reference.registry} does not allow deleting (CNCF "
                "distribution: storage.delete.enabled: true)"
            )


def _limited(response: Any, limit: int, what: str) -> Iterator[bytes]:
    """The body of ``response`` in chunks, refused past ``limit`` bytes."""
    seen = 0
    for chunk in response.iter_content(safe_io.CHUNK):
        seen += len(chunk)
        if seen > limit:
            response.close()
            raise Refused(f"{what} holds more than the {limit} bytes its manifest names")
        yield chunk


def _why(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 200 else text[:197] + "..."


def _failure(reference: Reference, method: str, path: str, response: Any) -> str:
    """The registry's own error (``{"errors": [{"code", "message"}]}``) in one line."""
    words = f"HTTP {response.status_code}"
    try:
        errors = json.loads(response.content[:65536]).get("errors") or []
        words += ": " + "; ".join(
            f"{e.get('code')} {e.get('message')}" for e in errors if isinstance(e, dict)
        )
    except (ValueError, AttributeError):
        pass
    hint = ""
    if response.status_code in (401, 403):
        hint = f" (check the login: {USERNAME_VARIABLE}/{PASSWORD_VARIABLE} or docker's config.json)"
    return f"{reference.name}: {method} {path.split('?')[0][:80]}: {words}{hint}"
