#!/usr/bin/env bash
# Fresh machine -> passing tests. Creates .venv (the gateway and test tools), the vLLM
# environment and the local models (cached under ${SPECGATE_CACHE_DIR:-~/.cache/specgate}),
# then runs lint, the type checker and every test, real vLLM CPU backends and headless Chromium included
# (installed with apt-get: run as root, as CI does).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ci-deps.sh  # Debian's chromium + chromedriver (status-page browser test), redis-server (replicas)
python3 -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check -e '.[test]'
.venv/bin/specgate models prepare
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy  # strict on gateway/ and backends/ ([tool.mypy] in pyproject.toml)
.venv/bin/pytest "$@"
