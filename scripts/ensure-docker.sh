#!/usr/bin/env bash
# Make sure a Docker daemon and the Compose v2 CLI plugin are here, for the container drill
# (tests/e2e/test_container_drill.py) and `make images` / `make stack-up`.
#
# - daemon: Debian's docker.io (apt), started as
#     dockerd --iptables=false --ip6tables=false --bridge=none --storage-driver=overlay2
#   when nothing answers `docker info` (no systemd in CI containers; log in $DOCKERD_LOG).
#   No bridge: every container of the CPU profile runs with host networking.
# - compose v2: the static `docker-compose` 2.x binary from Debian trixie's pool (bookworm's
#   compose is v1, which cannot run deploy/docker-compose.yml), installed as a CLI plugin.
# Idempotent: a second run with everything in place only checks `docker info` and `docker compose version`.
set -euo pipefail

DOCKERD_LOG="${DOCKERD_LOG:-/var/log/cascade-dockerd.log}"
COMPOSE_DEB_URL="${COMPOSE_DEB_URL:-http://deb.debian.org/debian/pool/main/d/docker-compose/docker-compose_2.26.1-4_amd64.deb}"
COMPOSE_DEB_SHA256="${COMPOSE_DEB_SHA256:-47681197cb2b1ab88206b42a1a92fc75f50d9530a6322d03494a473eed0408ea}"
PLUGIN_DIR="${DOCKER_PLUGIN_DIR:-/usr/local/lib/docker/cli-plugins}"

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

if ! command -v dockerd >/dev/null 2>&1; then
    echo "installing docker.io (the daemon)"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io >/dev/null \
        || { as_root apt-get update -q >/dev/null && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io >/dev/null; }
fi
if ! command -v mmdebstrap >/dev/null 2>&1; then
    echo "installing mmdebstrap (the local base images, scripts/docker-base.sh)"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q mmdebstrap >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
    echo "starting dockerd (log: $DOCKERD_LOG)"
    as_root sh -c "nohup dockerd --iptables=false --ip6tables=false --bridge=none \
        --storage-driver=overlay2 >>'$DOCKERD_LOG' 2>&1 &"
    for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
fi
docker info --format 'docker daemon {{.ServerVersion}} ({{.Driver}})'

if ! docker compose version >/dev/null 2>&1; then
    echo "installing compose v2 as a docker CLI plugin in $PLUGIN_DIR"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    curl -fsSL --retry 3 -o "$tmp/compose.deb" "$COMPOSE_DEB_URL"
    echo "$COMPOSE_DEB_SHA256  $tmp/compose.deb" | sha256sum -c - >/dev/null
    dpkg-deb -x "$tmp/compose.deb" "$tmp/x"
    bin="$(find "$tmp/x" -type f -path '*/cli-plugins/docker-compose' | head -n1)"
    as_root install -D -m 0755 "$bin" "$PLUGIN_DIR/docker-compose"
fi
docker compose version
