#!/bin/sh
# Install what tests/harness/slurm_cluster.py needs for a real single-node SLURM test
# cluster on Debian 12 (SLURM 22.05): munge, slurmctld, slurmd, slurmdbd, the
# SLURM clients, and the MariaDB server binaries (server-core for mariadbd and
# mariadb-install-db, client-core for the my_print_defaults it calls).
#
# Installed by .ci/apt-install.sh (idempotent, starts no daemon). Run as root.
set -eu

sh "$(dirname "$0")/apt-install.sh" slurm \
    "munge slurm-client slurmctld slurmd slurmdbd mariadb-server-core mariadb-client-core" \
    "munged mariadbd mariadb-install-db my_print_defaults slurmdbd slurmctld slurmd sbatch sinfo squeue sacct scontrol scancel"
