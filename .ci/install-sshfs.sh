#!/bin/sh
# Install what tests/harness/sshfs_mount.py needs for a real sshfs mount over loopback on
# Debian 12: the OpenSSH server (sshd, with the sftp-server sshfs talks to), the
# OpenSSH client tools (ssh, ssh-keygen) and sshfs with fuse3 (fusermount3); and
# what tests/harness/nodes.py needs for namespaced nodes joined by a bridge: iproute2 (ip)
# and util-linux (nsenter, unshare, setpriv).
#
# Idempotent: exits at once when every binary is already there. Otherwise it
# runs apt-get update and a non-interactive apt-get install. It never starts
# a daemon: while it installs, a policy-rc.d that denies every service start
# is in place (an existing one is left alone), and the test harness starts its
# own sshd by hand on a free port. The tests also need /dev/fuse (a container
# must be given it). Run as root.
set -eu

PACKAGES="openssh-server openssh-client sshfs fuse3 iproute2 util-linux"
BINARIES="sshd ssh ssh-keygen sshfs fusermount3 ip nsenter unshare setpriv"

missing() {
    for bin in $BINARIES; do
        PATH="$PATH:/usr/sbin:/sbin" command -v "$bin" >/dev/null 2>&1 || echo "$bin"
    done
    for file in /usr/lib/openssh/sftp-server; do
        [ -x "$file" ] || echo "$file"
    done
}

if [ -z "$(missing)" ]; then
    echo "install-sshfs: all sshfs test binaries already installed"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "install-sshfs: must run as root (missing: $(missing | tr '\n' ' '))" >&2
    exit 1
fi

POLICY=/usr/sbin/policy-rc.d
OWN_POLICY=""
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\n# temporary, from .ci/install-sshfs.sh: start no services\nexit 101\n' >"$POLICY"
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
    echo "install-sshfs: still missing after install: $still" >&2
    exit 1
fi
if [ ! -c /dev/fuse ]; then
    echo "install-sshfs: warning: /dev/fuse is missing; sshfs cannot mount here" >&2
fi
echo "install-sshfs: installed $PACKAGES"
