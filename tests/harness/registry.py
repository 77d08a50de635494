"""A real, throw-away OCI registry for tests: Debian's ``docker-registry`` (the CNCF
distribution server, 2.8) on ``127.0.0.1`` and a free port, with a filesystem store in the work
folder, deletes allowed and, with ``users``, htpasswd (bcrypt) authentication.

It runs on the harness of tests/harness/daemons.py (its pid is the server's; a killed test run's server
is swept by the next). ``.ci/install-registry.sh`` installs it, and ``htpasswd``.

Usage::

    with RegistryServer(tmp_path / "registry") as server:
        ref = f"{server.host}/lab/cache:1"
        ...
        server.blob_path("sha256:...")  # where the store keeps a blob's bytes
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import TracebackType

from daemons import HOST, Daemons
from processes import free_port, listening, which

#: Every executable the harness runs.
REGISTRY_BINARIES: tuple[str, ...] = ("docker-registry", "htpasswd")


class RegistryError(RuntimeError):
    """The registry did not start (the message has its log's tail)."""


def missing_requirements() -> list[str]:
    return [name for name in REGISTRY_BINARIES if which(name) is None]


_CONFIG = """version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {store}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
{auth}"""
_AUTH = """auth:
  htpasswd:
    realm: gpu-cache-tests
    path: {path}
"""


class RegistryServer:
    """``docker-registry serve`` on loopback; ``users``: name -> password for htpasswd auth."""

    def __init__(self, workdir: Path, users: dict[str, str] | None = None) -> None:
        self.workdir = Path(workdir)
        self.users = users or {}
        self.port = 0
        self.store = self.workdir / "store"
        self.daemons = Daemons("registry", self.workdir, error=RegistryError)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> RegistryServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.daemons.open()
        auth = ""
        if self.users:
            passwords = self.workdir / "htpasswd"
            passwords.write_text("")
            for user, password in self.users.items():
                subprocess.run(
                    ["htpasswd", "-B", "-b", str(passwords), user, password],
                    check=True,
                    capture_output=True,
                    timeout=60,
                )
            auth = _AUTH.format(path=passwords)
        self.port = free_port()
        config = self.workdir / "config.yml"
        config.write_text(_CONFIG.format(store=self.store, port=self.port, auth=auth))
        proc = self.daemons.spawn("registry", ["docker-registry", "serve", str(config)], node=HOST)
        self.daemons.wait("the registry", lambda: listening(proc.pid, self.port))
        return self

    def blob_path(self, digest: str) -> Path:
        """The file in the filesystem store that holds a blob's bytes."""
        hexdigest = digest.split(":", 1)[1]
        return self.store / "docker/registry/v2/blobs/sha256" / hexdigest[:2] / hexdigest / "data"

    def stop(self) -> None:
        survivors = self.daemons.stop()
        self.daemons.close()
        if survivors:
            raise RegistryError(f"still running: {', '.join(survivors)}")

    def __enter__(self) -> RegistryServer:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()
