#!/usr/bin/env bash
# Installs bubblewrap (the code sandbox) when it is missing and we may: root with apt-get.
# Without it a code reward refuses to run (unless its config says `sandbox: process`, which is
# not a security boundary), the security corpus is skipped and the reward service refuses to start.
set -euo pipefail
if command -v bwrap >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing bubblewrap (code sandbox)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap >/dev/null \
        || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap >/dev/null; }
    exit 0
fi
echo "bubblewrap not found: install the 'bubblewrap' package for the code sandbox" >&2
echo "(continuing: code rewards refuse to run unless configured with sandbox: process, not a boundary)" >&2
