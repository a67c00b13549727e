#!/usr/bin/env bash
# Installs Debian's headless-capable Chromium (the dashboard test's browser) when it is missing
# and we may: root with apt-get. Without it the dashboard test is skipped with its reason.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing chromium (dashboard test)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null \
        || { apt-get update -q >/dev/null \
             && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null; }
    exit 0
fi
echo "chromium not found: install Debian's 'chromium' package for the dashboard test" >&2
echo "(continuing: the dashboard test is skipped)" >&2
