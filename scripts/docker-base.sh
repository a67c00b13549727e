#!/usr/bin/env bash
# The local base image the CPU images build on where no registry can be pulled from:
# Debian bookworm (minbase, from Debian's own packages) + Python 3.11 (bookworm's python3),
# venv, CA certificates. `docker import`ed as $BASE_TAG; skipped when it is already there.
# The images take it through their PYTHON_IMAGE build argument (Makefile: `make images`); it
# stands in for python:3.11-slim-bookworm, which is the public default.
# The host's CA bundle goes in too (the build's pip and apt reach PyPI and Debian through it).
set -euo pipefail

BASE_TAG="${BASE_TAG:-cascade-base/python:3.11-bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
CA_BUNDLE="${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"

if docker image inspect "$BASE_TAG" >/dev/null 2>&1; then
    echo "base image $BASE_TAG: present"
    exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
mmdebstrap --variant=minbase --quiet \
    --include=python3,python3-venv,python-is-python3,ca-certificates \
    --customize-hook="copy-in $CA_BUNDLE /etc/ssl/certs/" \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
    bookworm "$tmp/rootfs.tar" "$MIRROR"
docker import \
    --change 'ENV LANG=C.UTF-8 PIP_CERT=/etc/ssl/certs/ca-certificates.crt SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
    --change 'CMD ["python3"]' \
    --change 'LABEL io.cascade.base=1' \
    "$tmp/rootfs.tar" "$BASE_TAG" >/dev/null
echo "base image $BASE_TAG: built in $(( $(date +%s) - start )) s, $(docker image inspect -f '{{.Size}}' "$BASE_TAG" | awk '{printf "%.0f MB", $1/1e6}')"
