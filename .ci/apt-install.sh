#!/bin/sh
# One apt install for the .ci/install-*.sh scripts:
#   sh .ci/apt-install.sh NAME "PACKAGES" "BINARIES" ["FILES"]
# Idempotent: exits at once when every binary (looked up on PATH and in /usr/sbin,
# /sbin) and every file is already there. Otherwise it runs apt-get update and a
# non-interactive apt-get install. It never starts a daemon: while it installs, a
# policy-rc.d that denies every service start is in place (an existing one is left
# alone), and the tests start their daemons by hand. Run as root.
set -eu

NAME="$1"
PACKAGES="$2"
BINARIES="$3"
FILES="${4:-}"

missing() {
    for bin in $BINARIES; do
        PATH="$PATH:/usr/sbin:/sbin" command -v "$bin" >/dev/null 2>&1 || echo "$bin"
    done
    for file in $FILES; do
        [ -x "$file" ] || echo "$file"
    done
}

if [ -z "$(missing)" ]; then
    echo "install-$NAME: all $NAME test binaries already installed"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "install-$NAME: must run as root (missing: $(missing | tr '\n' ' '))" >&2
    exit 1
fi

POLICY=/usr/sbin/policy-rc.d
OWN_POLICY=""
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\n# temporary, from .ci/install-%s.sh: start no services\nexit 101\n' "$NAME" >"$POLICY"
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
    echo "install-$NAME: still missing after install: $still" >&2
    exit 1
fi
echo "install-$NAME: installed $PACKAGES"
