#!/usr/bin/env bash
# Fresh machine -> passing tests. Creates .venv (the gateway and test tools), the vLLM
# environment and the local models (cached under ${SPECGATE_CACHE_DIR:-~/.cache/specgate}),
# then runs lint and every test, real vLLM CPU backends included.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check -e '.[test]'
.venv/bin/specgate models prepare
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/pytest "$@"
