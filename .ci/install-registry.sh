#!/bin/sh
# Install what tests/harness/registry.py needs for a real OCI registry over loopback on
# Debian 12: Debian's docker-registry (the CNCF distribution server, 2.8:
# `docker-registry serve config.yml`, filesystem store) and apache2-utils
# (htpasswd, for the test with basic authentication). The package would start its own
# registry on port 5000 (denied while it installs); the tests start theirs by hand on a
# free loopback port.
#
# Installed by .ci/apt-install.sh (idempotent, starts no daemon). Run as root.
set -eu

sh "$(dirname "$0")/apt-install.sh" registry \
    "docker-registry apache2-utils" \
    "docker-registry htpasswd"
