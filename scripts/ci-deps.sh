#!/usr/bin/env bash
# System packages the tests need beyond Python: Debian's Chromium and its matching
# chromedriver, for the status-page browser test (tests/unit/test_status_browser.py), and
# Debian's redis-server, for the replicas' shared state (tests/unit/test_replicas.py starts
# its own on an ephemeral port; the package's service is not used).
# Idempotent: does nothing when all are already installed. Needs root (CI runs as root).
set -euo pipefail
if [[ -x /usr/bin/chromium && -x /usr/bin/chromedriver && -x /usr/bin/redis-server ]]; then
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq chromium chromium-driver redis-server
