"""Fast task classifier: code, rag, chat or creative, from an OpenAI request body.

A transparent linear model, multinomial logistic regression with ``chat`` as the reference
class (logit 0), over the named features of ``gateway.routing.signals``. Each weight is the
change in log-odds of a task versus chat per unit of a feature:

- the code and creative columns are fitted offline by ``python -m bench.classify --fit`` on
  the development prompts (L2-regularised, class-balanced; the bench reports held-out scores);
- the rag column and a few code/creative weights are set by hand, each with its reason below,
  where the development set cannot teach the right weight (one RAG template, no tools, no
  context in earlier turns, programming requests labelled chat).

Cost: at most ~4,000 characters read whatever the body's size (see ``gateway.routing.text``),
a few dozen C-level scans and set lookups, one dot product: tens of microseconds per decision
(``python -m bench.classify`` measures it). No I/O, no mutable state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.routing.signals import FEATURES, extract_features
from gateway.routing.text import is_structured

__all__ = ["FEATURES", "TASKS", "TaskGuess", "classify", "extract_features", "probabilities"]

TASKS = ("code", "rag", "chat", "creative")
_PROB_KEYS = tuple((task, f"p_{task}") for task in TASKS)

# Hand-set rag column. The development set has a single RAG template, so a fitted rag column
# would learn that template's conjunction of cues; here each cue can carry much of the decision.
RAG_BIAS = -3.5
RAG_WEIGHTS: dict[str, float] = {
    "doc_markers": 1.5,  # [1], <document>, ### Source 2, Title: ... (log1p of the count)
    "rag_phrases": 1.5,  # "use the following context", "according to the passage", ...
    "rag_terms": 1.0,  # context, passages, documents, excerpts, ...
    "qa_labels": 1.0,  # Question: / Answer: / Query:
    "tail_question": 1.0,  # a question after 1,000+ characters of material
    "length": 0.5,  # log2 of the final message's length in thousands of characters
    "context_turn": 4.5,  # documents in the system prompt or an earlier turn, short question
    "stub": -2.0,  # source code, not documents
    "indent": -1.0,
}
# Hand-set (code, creative) weights, not refit by the bench.
HAND_WEIGHTS: dict[str, tuple[float, float]] = {
    "structured": (5.0, -2.0),  # tools / JSON output: low-entropy output, like code
    # The development chat class holds ~20 programming requests (AlpacaEval, MT-Bench); fitted,
    # these weights learn to discount language names and "write a function ...", which is
    # wrong for routing (fitted: code_langs 0.76, code_ask 1.66; these cost <0.2 points of
    # macro-F1 on that set).
    "code_langs": (2.0, -1.0),
    "code_ask": (2.0, -1.0),
    "context_turn": (-1.0, -1.0),
}
# Fitted by `python -m bench.classify --fit`: feature -> (code, creative) log-odds vs chat.
BIAS: tuple[float, float] = (-1.848, -0.537)
WEIGHTS: dict[str, tuple[float, float]] = {
    "syntax": (2.599, -0.984),
    "indent": (1.845, 0.018),
    "fence": (-0.778, -0.000),
    "code_tokens": (0.484, -0.163),
    "code_terms": (0.802, -1.240),
    "stub": (1.731, -0.071),
    "doc_markers": (0.034, -0.591),
    "rag_terms": (-0.792, -0.294),
    "rag_phrases": (-0.410, -0.606),
    "qa_labels": (-0.338, -0.040),
    "length": (1.880, 0.882),
    "tail_question": (-0.194, 0.025),
    "write_verb": (0.206, 0.466),
    "roleplay": (-0.184, 1.507),
    "creative_nouns": (-0.517, 1.615),
    "creative_ask": (-0.110, 0.597),
    "fiction": (-0.430, 0.521),
    "style": (-0.110, 0.573),
    "length_spec": (0.150, 0.932),
    "narrative": (-0.640, 0.411),
    "info_words": (0.332, -1.052),
    "chat_verb": (-0.887, -1.456),
    "question_start": (0.306, -1.915),
    "question_mark": (-0.657, -0.876),
    "short": (-0.887, -0.354),
}


@dataclass(frozen=True, slots=True)
class TaskGuess:
    """A task decision: ``task`` in TASKS, ``confidence`` in 0..1 (the model's probability
    of that task), ``features`` the non-zero features and the four probabilities (``p_*``)."""

    task: str
    confidence: float
    features: dict[str, float]


def _table(
    weights: Mapping[str, tuple[float, float]],
) -> dict[str, tuple[float, float, float]]:
    """feature -> (code, creative, rag) weights: fitted or hand code/creative, hand rag."""
    names = {*weights, *HAND_WEIGHTS, *RAG_WEIGHTS}
    return {
        name: (
            *(weights.get(name) or HAND_WEIGHTS.get(name) or (0.0, 0.0)),
            RAG_WEIGHTS.get(name, 0.0),
        )
        for name in names
    }


_SHIPPED = _table(WEIGHTS)


def probabilities(
    feats: Mapping[str, float],
    weights: Mapping[str, tuple[float, float]] | None = None,
    bias: tuple[float, float] | None = None,
) -> dict[str, float]:
    """Softmax probability of each task in TASKS given ``feats``.

    ``weights``/``bias``: the fitted (code, creative) columns, default the shipped ones; the
    rag column and the hand weights are fixed.
    """
    table = _SHIPPED if weights is None else _table(weights)
    code, creative = BIAS if bias is None else bias
    rag = RAG_BIAS
    for name, value in feats.items():
        if value:
            wt = table.get(name)
            if wt is not None:
                code += wt[0] * value
                creative += wt[1] * value
                rag += wt[2] * value
    top = max(code, rag, 0.0, creative)
    e_code, e_rag = math.exp(code - top), math.exp(rag - top)
    e_chat, e_creative = math.exp(-top), math.exp(creative - top)
    total = e_code + e_rag + e_chat + e_creative
    return {"code": e_code / total, "rag": e_rag / total, "chat": e_chat / total,
            "creative": e_creative / total}  # fmt: skip


def classify(body: Mapping[str, Any], *, default_task: str = "chat") -> TaskGuess:
    """Guess the task of an OpenAI request body.

    ``body``: the parsed JSON of a completions request (``prompt``: string, list of strings,
    token ids) or a chat request (``messages`` with string or part-list contents). Malformed
    or unreadable bodies (e.g. token-id prompts) give ``default_task`` with confidence 0.25,
    or ``code`` with 0.6 when tools or JSON output are requested. Never raises.
    """
    if default_task not in TASKS:
        default_task = "chat"
    feats = extract_features(body) if isinstance(body, Mapping) else None
    if feats is None:
        if isinstance(body, Mapping) and is_structured(body):
            return TaskGuess("code", 0.6, {"structured": 1.0})
        return TaskGuess(default_task, 0.25, {})
    probs = probabilities(feats)
    task = max(TASKS, key=probs.__getitem__)
    shown = {name: value for name, value in feats.items() if value}
    for t, key in _PROB_KEYS:
        shown[key] = round(probs[t], 3)
    return TaskGuess(task, round(probs[task], 4), shown)
