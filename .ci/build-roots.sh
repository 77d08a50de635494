#!/usr/bin/env bash
# Build the isolated filesystem roots ("images") that the container tests run
# Snakemake jobs in, through the bwrap-based stand-in tests/bin/apptainer.
#
# Each root is a minimal Debian tree made with mmdebstrap, with a Python and a
# jax/jaxlib that differ from the host's (host: Python 3.11, jax 0.10.2), the
# jax wheels installed by the root's OWN pip (so its own resolver picks the
# wheels and markers for its Python). No zstandard in it: JAX there writes
# zlib-compressed cache entries, as in an image that lacks it.
#
#   root:      $GPU_CACHE_TEST_ROOTS/<name>/          (default /var/cache/gpu-cache-test-roots)
#   manifest:  $GPU_CACHE_TEST_ROOTS/<name>.json      (measured inside the finished root)
#   image URL: docker://gpu-cache-test/<name>          (what tests/bin/apptainer maps to the root)
#
# Idempotent: a root whose manifest carries the same recipe hash is left alone,
# and when bwrap and mmdebstrap are already installed apt is not touched, so a
# second run is a no-op that takes well under a second. A changed recipe
# rebuilds that root. Builds go to a temporary folder next to the root and are
# renamed into place only after they passed the checks, so an interrupted build
# never leaves a half root behind a valid manifest.
#
# Needs root and the registries (deb.debian.org, pypi.org); the tests never
# download. Run from .ci/run before pytest. Measured on the 2-core CI box: about
# 35 s for the bullseye root (22 s mmdebstrap, 10 s pip), 670 MB on disk.
set -euo pipefail

ROOTS="${GPU_CACHE_TEST_ROOTS:-/var/cache/gpu-cache-test-roots}"
MIRROR="${GPU_CACHE_TEST_MIRROR:-http://deb.debian.org/debian}"
# The host's CA bundle, handed to the root's pip while it installs (a proxy on
# the way to PyPI may present a certificate only the host's bundle trusts).
HOST_CA="${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}"
RECIPE_VERSION=1   # bump when the build steps below change in a way that matters

log() { echo "build-roots: $*" >&2; }

# --- the tools -----------------------------------------------------------------------
need_tools() {
    local missing=""
    command -v bwrap >/dev/null 2>&1 || missing="$missing bubblewrap"
    command -v mmdebstrap >/dev/null 2>&1 || missing="$missing mmdebstrap"
    echo "$missing"
}

if [ -n "$(need_tools)" ]; then
    if [ "$(id -u)" -ne 0 ]; then
        log "must run as root to install:$(need_tools)"
        exit 1
    fi
    log "installing$(need_tools)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends mmdebstrap bubblewrap
fi

# --- one root ------------------------------------------------------------------------
# build_root NAME SUITE "DEB PACKAGES" "PIP PINS"
build_root() {
    local name="$1" suite="$2" debs="$3" pins="$4"
    local dest="$ROOTS/$name" manifest="$ROOTS/$name.json"
    local recipe
    recipe="$(printf '%s\n' "$RECIPE_VERSION" "$suite" "$debs" "$pins" "$MIRROR" | sha256sum | cut -c1-16)"

    if [ -d "$dest" ] && [ -f "$manifest" ] && grep -q "\"recipe\": \"$recipe\"" "$manifest"; then
        log "$name: up to date ($dest)"
        return 0
    fi
    if [ "$(id -u)" -ne 0 ]; then
        log "$name: must run as root to build"
        exit 1
    fi
    if [ ! -r "$HOST_CA" ]; then
        log "$name: no CA bundle at $HOST_CA (set PIP_CERT)"
        exit 1
    fi

    local start tmp
    start=$(date +%s)
    tmp="$ROOTS/.$name.build.$$"
    rm -rf "$tmp"
    # shellcheck disable=SC2064
    trap "rm -rf '$tmp'" EXIT
    log "$name: mmdebstrap $suite ($debs) -> $tmp"
    # minbase + the packages; no recommends; no docs/man/locales. The customize
    # hooks run with the root set up by mmdebstrap (resolv.conf, /proc, /dev).
    # The root's pip gets a clean environment (env -i): the host's PIP_* variables
    # (find-links, extra indexes, constraints) must not leak into the image.
    local pipenv="env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8"
    # shellcheck disable=SC2086
    mmdebstrap --quiet --variant=minbase \
        --include="$(echo $debs | tr ' ' ',')" \
        --aptopt='Apt::Install-Recommends "false"' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --customize-hook="cp '$HOST_CA' \"\$1/tmp/host-ca.crt\"" \
        --customize-hook="chroot \"\$1\" $pipenv python3 -m pip install --quiet --no-cache-dir --only-binary=:all: --cert /tmp/host-ca.crt $pins" \
        --customize-hook='rm -f "$1/tmp/host-ca.crt"' \
        --customize-hook='mkdir -p "$1/.singularity.d/env" "$1/.singularity.d/libs"' \
        --customize-hook='printf "%s\n" "#!/bin/sh" "# what a Docker image ENV converted by Apptainer looks like: a host value wins" "export PATH=\"/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\"" "export PYTHONDONTWRITEBYTECODE=\"\${PYTHONDONTWRITEBYTECODE:-1}\"" "export LANG=\"\${LANG:-C.UTF-8}\"" >"$1/.singularity.d/env/10-docker2singularity.sh"' \
        "$suite" "$tmp" "$MIRROR"

    # Check and measure the finished root from inside, the way the tests see it.
    local probe
    probe="$(bwrap --ro-bind "$tmp" / --dev /dev --proc /proc --tmpfs /tmp --chdir / \
        env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp \
        JAX_PLATFORMS=cpu python3 -c '
import importlib.util, json, platform, sys
import jax, jaxlib, numpy
y = jax.jit(lambda x: x * 2 + 1)(numpy.arange(3.0))
assert list(map(float, y)) == [1.0, 3.0, 5.0], y
print(json.dumps({
    "python": platform.python_version(),
    "python_executable": "/usr/bin/python3",
    "jax": jax.__version__,
    "jaxlib": jaxlib.__version__,
    "numpy": numpy.__version__,
    "zstandard": importlib.util.find_spec("zstandard") is not None,
}))')"
    if echo "$probe" | grep -q '"zstandard": true'; then
        log "$name: zstandard is installed in the root; it must not be"
        exit 1
    fi
    local os_release size seconds
    os_release="$(. "$tmp/etc/os-release" && echo "$PRETTY_NAME")"
    size="$(du -sm "$tmp" | cut -f1)"
    seconds=$(( $(date +%s) - start ))

    rm -rf "$dest" "$manifest"
    mv "$tmp" "$dest"
    trap - EXIT
    python3 - "$manifest" "$probe" <<EOF
import json, sys
probe = json.loads(sys.argv[2])
manifest = {
    "name": "$name",
    "image": "docker://gpu-cache-test/$name",
    "root": "$dest",
    "os": "$os_release",
    "suite": "$suite",
    "debian_packages": "$debs".split(),
    "pip_pins": "$pins".split(),
    "image_env": {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                  "PYTHONDONTWRITEBYTECODE": "1 (unless the host sets it)",
                  "LANG": "C.UTF-8 (unless the host sets it)"},
    **probe,
    "size_mb": $size,
    "build_seconds": $seconds,
    "recipe": "$recipe",
}
with open(sys.argv[1] + ".tmp", "w") as f:
    json.dump(manifest, f, indent=2)
    f.write("\n")
EOF
    mv "$manifest.tmp" "$manifest"
    log "$name: built in ${seconds} s, ${size} MB: $probe"
}

mkdir -p "$ROOTS"
exec 9>"$ROOTS/.lock"
flock 9   # one build at a time per roots folder

# Python 3.9 (bullseye) with jax 0.4.30, the newest jax for Python 3.9; every
# wheel pinned so that the root is the same on every CI run.
build_root bullseye-py39-jax0430 bullseye "python3 python3-pip ca-certificates" \
    "jax==0.4.30 jaxlib==0.4.30 numpy==2.0.2 scipy==1.13.1 ml-dtypes==0.5.4 opt-einsum==3.4.0 importlib-metadata==8.7.1 zipp==3.23.1"
