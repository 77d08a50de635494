#!/bin/sh
# Install what tests/registry.py needs for a real OCI registry over loopback on
# Debian 12: Debian's docker-registry (the CNCF distribution server, 2.8:
# `docker-registry serve config.yml`, filesystem store) and apache2-utils
# (htpasswd, for the test with basic authentication).
#
# Idempotent: exits at once when both binaries are already there. Otherwise it
# runs apt-get update and a non-interactive apt-get install. It never starts
# a daemon: while it installs, a policy-rc.d that denies every service start
# is in place (an existing one is left alone; the package would otherwise start
# its own registry on port 5000), and the tests start their own registry by
# hand on a free loopback port. Run as root.
set -eu

PACKAGES="docker-registry apache2-utils"
BINARIES="docker-registry htpasswd"

missing() {
    for bin in $BINARIES; do
        PATH="$PATH:/usr/sbin:/sbin" command -v "$bin" >/dev/null 2>&1 || echo "$bin"
    done
}

if [ -z "$(missing)" ]; then
    echo "install-registry: all registry test binaries already installed"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "install-registry: must run as root (missing: $(missing | tr '\n' ' '))" >&2
    exit 1
fi

POLICY=/usr/sbin/policy-rc.d
OWN_POLICY=""
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\n# temporary, from .ci/install-registry.sh: start no services\nexit 101\n' >"$POLICY"
    chmod 755 "$POLICY"
    OWN_POLICY=1
fi
cleanup() { if [ -n "$OWN_POLICY" ]; then rm -f "$POLICY"; fi; }
trap cleanup EXIT INT TERM

export DEBIAN_FRONTEND=noninteractive
apt-get update
# shellcheck disable=SC2086
apt-get install -y --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
    $PACKAGES

still="$(missing | tr '\n' ' ')"
if [ -n "$still" ]; then
    echo "install-registry: still missing after install: $still" >&2
    exit 1
fi
echo "install-registry: installed $PACKAGES"
