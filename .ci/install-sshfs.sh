#!/bin/sh
# Install what tests/harness/sshfs_mount.py needs for a real sshfs mount over loopback on
# Debian 12: the OpenSSH server (sshd, with the sftp-server sshfs talks to), the
# OpenSSH client tools (ssh, ssh-keygen) and sshfs with fuse3 (fusermount3); and
# what tests/harness/nodes.py needs for namespaced nodes joined by a bridge: iproute2 (ip)
# and util-linux (nsenter, unshare, setpriv). The tests also need /dev/fuse (a container
# must be given it).
#
# Installed by .ci/apt-install.sh (idempotent, starts no daemon). Run as root.
set -eu

sh "$(dirname "$0")/apt-install.sh" sshfs \
    "openssh-server openssh-client sshfs fuse3 iproute2 util-linux" \
    "sshd ssh ssh-keygen sshfs fusermount3 ip nsenter unshare setpriv" \
    /usr/lib/openssh/sftp-server
if [ ! -c /dev/fuse ]; then
    echo "install-sshfs: warning: /dev/fuse is missing; sshfs cannot mount here" >&2
fi
