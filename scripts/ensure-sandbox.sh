#!/usr/bin/env bash
# Installs bubblewrap (the code sandbox) when it is missing and we may: root with apt-get.
# Without it the code verifier falls back to the plain-process harness (not a security
# boundary) and the security corpus is skipped; the reward service refuses to start.
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
echo "(continuing: code runs in the plain-process harness, which is not a security boundary)" >&2
