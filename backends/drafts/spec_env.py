"""The virtual environment that runs ``speculators`` (CLI-time, blocking; like ``vllm_env``).

speculators (PyPI, vLLM project) trains EAGLE-3 heads. Installed with its dependencies it
fails here (it requires torchaudio, and no torchaudio build matches vLLM's torch 2.13), and it
never imports torchaudio, so it gets a venv of its own next to the vLLM one
(``CACHE/speculators-venv``) that *sees* the vLLM venv's packages (torch, transformers,
pydantic, loguru, openai, typer, rich, dill) through a ``.pth`` file, and holds speculators
(``--no-deps``) plus its remaining real dependencies. Its own site-packages come first on
``sys.path``, so its pins win. Created on first use, verified, marked, then cached.
"""

from __future__ import annotations

import json
from pathlib import Path

from backends.vllm_env import LogFn, run_command
from contracts.paths import CachePaths

#: speculators and the dependencies the vLLM venv lacks (its METADATA, less torchaudio).
SPECULATORS_REQUIREMENTS: tuple[str, ...] = (
    "speculators==0.9.0",
    "hs-connectors==0.9.0",
    "datasets==5.1.0",
    "multiprocess",
    "pyarrow",
    "pandas",
    "python-dateutil",
    "six",
    "tzdata",
    "xxhash",
    "fsspec",
)
MARKER_NAME = "specgate-speculators-env.json"
PTH_NAME = "specgate-vllm-venv.pth"
_VERIFY_CODE = (
    "import torch, transformers, datasets, hs_connectors, speculators; "
    "from speculators.train import trainer; from speculators.cli import app"
)


def speculators_venv(paths: CachePaths) -> Path:
    """``CACHE/speculators-venv``, beside ``CACHE/vllm-venv``."""
    return paths.root / "speculators-venv"


def speculators_python(paths: CachePaths) -> Path:
    """The interpreter of :func:`speculators_venv`."""
    return speculators_venv(paths) / "bin" / "python"


def _expected_marker(paths: CachePaths) -> dict[str, object]:
    return {"requirements": list(SPECULATORS_REQUIREMENTS), "base": str(paths.vllm_venv)}


def is_speculators_env_ready(paths: CachePaths) -> bool:
    """True when the venv's python exists and its marker matches the current requirements."""
    marker = speculators_venv(paths) / MARKER_NAME
    if not speculators_python(paths).exists() or not marker.is_file():
        return False
    try:
        return bool(json.loads(marker.read_text()) == _expected_marker(paths))
    except (OSError, ValueError):
        return False


def _site_packages(python: Path) -> Path:
    out = run_command(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        log=lambda _line: None,
    )
    return Path(out[-1])


def ensure_speculators_env(paths: CachePaths, vllm_python: Path, *, log: LogFn = print) -> Path:
    """Make sure the speculators venv exists and works; return its python.

    Cheap when done before (marker check). Otherwise: ``vllm_python -m venv`` (same Python
    as vLLM's), a ``.pth`` naming the vLLM venv's site-packages, ``pip install --no-deps``
    of :data:`SPECULATORS_REQUIREMENTS` (pip's configured index and find-links), an import
    check, then the marker. Idempotent; an interrupted setup is completed by the next call.
    Raises ``backends.vllm_env.SetupError`` with the failing command and its output tail.
    """
    if is_speculators_env_ready(paths):
        return speculators_python(paths)
    venv, python = speculators_venv(paths), speculators_python(paths)
    (venv / MARKER_NAME).unlink(missing_ok=True)
    if not python.exists():
        log(f"creating the speculators virtual environment in {venv}")
        run_command([str(vllm_python), "-m", "venv", str(venv)], log=log)
    own, base = _site_packages(python), _site_packages(vllm_python)
    (own / PTH_NAME).write_text(f"{base}\n", encoding="utf-8")
    log(f"installing {' '.join(SPECULATORS_REQUIREMENTS)} (--no-deps; torch etc. from vLLM's)")
    run_command(
        [str(python), "-m", "pip", "install", "--progress-bar", "off", "--no-deps"]
        + list(SPECULATORS_REQUIREMENTS),
        log=log,
    )
    run_command([str(python), "-c", _VERIFY_CODE], log=log)
    tmp = venv / (MARKER_NAME + ".tmp")
    tmp.write_text(json.dumps(_expected_marker(paths), indent=2) + "\n")
    tmp.replace(venv / MARKER_NAME)
    log(f"speculators environment ready: {python}")
    return python
