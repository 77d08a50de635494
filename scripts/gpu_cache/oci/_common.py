"""What publish, fetch and the listing share: their logger, errors and the artifact's names."""

from __future__ import annotations

import logging

log = logging.getLogger("gpu_cache.oci")

#: The artifact's media types: a manifest per GPU type (``artifactType``), its config (what
#: was validated, and what fetch checks before it downloads a layer), a layer per kind (a
#: gzip-compressed ``gpu-cache pack`` archive of that kind's entries, with stable times).
ARTIFACT_TYPE = "application/vnd.gpu-cache.pack.v1"
CONFIG_TYPE = "application/vnd.gpu-cache.pack.config.v1+json"
LAYER_TYPE = "application/vnd.gpu-cache.pack.layer.v1.tar+gzip"
#: Annotations of an index entry, of a manifest and of a layer.
GPU_TYPE_KEY = "io.gpu-cache.gpu-type"
ARCH_KEY = "io.gpu-cache.arch"
DEVICE_KEY = "io.gpu-cache.device"
IMAGE_KEY = "io.gpu-cache.image"
SOFTWARE_KEY = "io.gpu-cache.software"
VERDICT_KEY = "io.gpu-cache.verdict"
KIND_KEY = "io.gpu-cache.kind"
TITLE_KEY = "org.opencontainers.image.title"
CREATED_KEY = "org.opencontainers.image.created"
#: The config's format.
CONFIG_FORMAT = "gpu-cache-registry-pack"
CONFIG_VERSION = 1
#: Largest config blob read.
MAX_CONFIG = 16 << 20


class RegistryError(Exception):
    """The registry could not do what was asked (a missing tag, a refused login, no delete):
    one line, exit code 1; in the workflow (``--no-fail``) a warning and a normal warm."""


class Unreachable(RegistryError):
    """The registry does not answer."""


class Refused(RegistryError):
    """An artifact that fetch will not write here: damaged, of other software or another GPU
    type, or hostile. Nothing has been written."""

    def __str__(self) -> str:
        return f"{super().__str__()}; refused, nothing written"
