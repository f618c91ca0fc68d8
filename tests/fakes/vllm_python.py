"""Run a snippet in the prepared vLLM environment's Python (its real argument parser, its
real modules), for tests that check generated vLLM commands without starting a server."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from contracts.paths import CachePaths

#: The vLLM venv's interpreter (``specgate models prepare`` creates it; CI runs that first).
VLLM_PYTHON = CachePaths.default().vllm_python


def run_in_vllm(script: str, payload: Any, timeout_s: float) -> Any:
    """Run ``script`` with ``payload`` as JSON in ``sys.argv[1]``; return the JSON on its last
    stdout line. Skips the test when importing vLLM outlasts ``timeout_s`` seconds; fails it,
    with vLLM's stderr, when the script exits non-zero."""
    try:
        proc = subprocess.run(
            [str(VLLM_PYTHON), "-c", script, json.dumps(payload)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.skip("importing vLLM took too long on this machine")
    if proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr:
        pytest.skip(f"this vLLM has another parser layout: {proc.stderr.splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
