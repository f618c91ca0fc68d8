#!/usr/bin/env bash
# System packages the tests need beyond Python: Debian's Chromium and its matching
# chromedriver, for the status-page browser test (tests/unit/test_status_browser.py).
# Idempotent: does nothing when both are already installed. Needs root (CI runs as root).
set -euo pipefail
if [[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]]; then
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq chromium chromium-driver
