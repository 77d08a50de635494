"""Validated packs through an OCI registry (issue 32): ``gpu-cache publish`` and ``fetch``.

**What is published.** One reference per image (``registry.example.org/lab/af3-cache:2.6.2``)
names an OCI image index whose entries are the GPU types that image's cache was validated on.
Each entry is an artifact manifest (``artifactType`` :data:`ARTIFACT_TYPE`) whose annotations
name the GPU type, its architecture (the Triton target, ``sm_90``; ``cpu-x86_64``), the device,
the image, the software (Python, jax, jaxlib, triton, torch) and the verdict; its config blob
holds the same and, per kind, the software and device sections of the packs that unpack checks;
its layers are one stable ``gpu-cache pack`` archive per carried kind
(:data:`gpu_cache.core.kinds.CARRIED`) with the entries the validated passes used. Stable: no
time, host or ``-atime`` file in a layer, so re-publishing unchanged entries uploads nothing.

**What fetch trusts.** Every digest (index, manifest, config, layer) is checked while its bytes
stream into a private temporary folder; then each layer goes through ``gpu-cache unpack``'s
checks as a dry run (software and GPU type, hostile members, every file's digest), and only
when every layer passed are entries written, through unpack's own path. A digest proves the
bytes are those the reference names, not who pushed them: see docs/registry.md.
"""

from ._client import (
    DOCKER_CONFIG_VARIABLE,
    MANIFEST_TYPE,
    PASSWORD_VARIABLE,
    USERNAME_VARIABLE,
    Reference,
    Session,
    base_url,
    parse_reference,
    sha256_digest,
)
from ._common import ARTIFACT_TYPE, Refused, RegistryError, Unreachable
from ._config import references
from ._fetch import FetchReport, fetch, render_fetch
from ._listing import listing, render_listing, retire
from ._publish import PublishReport, load_verdict, publish, render_publish

__all__ = [
    "ARTIFACT_TYPE",
    "DOCKER_CONFIG_VARIABLE",
    "MANIFEST_TYPE",
    "PASSWORD_VARIABLE",
    "USERNAME_VARIABLE",
    "FetchReport",
    "PublishReport",
    "Reference",
    "Refused",
    "RegistryError",
    "Session",
    "Unreachable",
    "base_url",
    "fetch",
    "listing",
    "load_verdict",
    "parse_reference",
    "publish",
    "references",
    "render_fetch",
    "render_listing",
    "render_publish",
    "retire",
    "sha256_digest",
]
