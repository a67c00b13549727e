#!/usr/bin/env bash
# Installs faketime (libfaketime) when it is missing and we may: root with apt-get. The chaos drill
# starts a learner whose clock runs a minute ahead with it (leases must use the database's clock);
# without it that fault runs with the true clock and says so.
set -euo pipefail
if command -v faketime >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing faketime (the chaos drill's skewed clock)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q faketime >/dev/null \
        || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q faketime >/dev/null; }
    exit 0
fi
echo "faketime not found: install the 'faketime' package for the chaos drill's skewed clock" >&2
