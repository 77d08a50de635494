#!/bin/sh
# Install what tests/harness/slurm_cluster.py needs for a real single-node SLURM test
# cluster on Debian 12 (SLURM 22.05): munge, slurmctld, slurmd, slurmdbd, the
# SLURM clients, and the MariaDB server binaries (server-core for mariadbd and
# mariadb-install-db, client-core for the my_print_defaults it calls).
#
# Idempotent: exits at once when every binary is already there. Otherwise it
# runs apt-get update and a non-interactive apt-get install. It never starts
# a daemon: while it installs, a policy-rc.d that denies every service start
# is in place (an existing one is left alone), and the test harness starts the
# daemons by hand. Run as root.
set -eu

PACKAGES="munge slurm-client slurmctld slurmd slurmdbd mariadb-server-core mariadb-client-core"
BINARIES="munged mariadbd mariadb-install-db my_print_defaults slurmdbd slurmctld slurmd sbatch sinfo squeue sacct scontrol scancel"

missing() {
    for bin in $BINARIES; do
        PATH="$PATH:/usr/sbin:/sbin" command -v "$bin" >/dev/null 2>&1 || echo "$bin"
    done
}

if [ -z "$(missing)" ]; then
    echo "install-slurm: all SLURM test binaries already installed"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "install-slurm: must run as root (missing: $(missing | tr '\n' ' '))" >&2
    exit 1
fi

POLICY=/usr/sbin/policy-rc.d
OWN_POLICY=""
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\n# temporary, from .ci/install-slurm.sh: start no services\nexit 101\n' >"$POLICY"
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
    echo "install-slurm: still missing after install: $still" >&2
    exit 1
fi
echo "install-slurm: installed $PACKAGES"
