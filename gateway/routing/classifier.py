"""Fast task classifier: code, rag, chat or creative, from an OpenAI request body.

A transparent linear model (multinomial logistic regression with ``chat`` as the reference
class) over a few named, bounded-cost features. Each weight is the change in log-odds of a
task versus chat per unit of a feature. Weights marked "fitted" were computed offline by
``python -m bench.classify --fit`` on the development prompts (L2-regularised, see the bench
for held-out scores); weights marked "hand" cover request shapes that set cannot show
(tools, JSON output, context in an earlier message) and were set by reasoning.

Cost: reads at most ~5,000 characters of text (see ``gateway.routing.text``), a few dozen
C-level string scans, set intersections and one dot product. No I/O, no mutable state.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.routing import lexicon as lx
from gateway.routing.text import RequestText, is_structured, read_request

TASKS = ("code", "rag", "chat", "creative")
SCORED = ("code", "rag", "creative")  # chat is the reference class: logit 0
FEATURES = (
    "syntax", "indent", "fence", "code_tokens", "code_langs", "code_terms", "code_ask", "stub",
    "doc_markers", "rag_terms", "rag_phrases", "qa_labels", "length", "tail_question",
    "context_turn", "write_verb", "roleplay", "creative_nouns", "creative_ask", "fiction", "style", "length_spec", "chat_verb", "question_start", "question_mark", "short",
    "structured",
)  # fmt: skip

_SYNTAX = b"{}();=<>[]_"
_STUB = re.compile(
    r"\s*(?:def \w+\s*\(|class \w+\s*[:(]|import \w|from [\w.]+ import |#include|package \w"
    r"|<\?php|#!/|(?:const|let|var) \w+\s*=|fn \w+\s*\(|func \w+\s*\(|public (?:class|static)"
    r"|(?:async )?function\s*\w*\s*\()"
)
# RAG phrases grouped by a key word, so a phrase is only searched when its key word occurs.
_PHRASE_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = tuple(
    (key, tuple(p for p in lx.RAG_PHRASES if key in p))
    for key in ("following", "based", "according", "answer", "context", "passage", "document",
                "article", "text", "provided", "retrieved", "search", "know", "only", "cite",
                "source")
)  # fmt: skip

# Fitted weights: feature -> (code, rag, creative) log-odds versus chat.
BIAS: tuple[float, float, float] = (-1.886, -6.214, -0.823)
WEIGHTS: dict[str, tuple[float, float, float]] = {
    "syntax": (2.354, 0.036, -1.036),
    "indent": (1.535, -0.012, 0.118),
    "fence": (-0.810, -0.000, -0.002),
    "code_tokens": (1.150, 0.036, 0.237),
    "code_langs": (0.947, 0.006, -0.600),
    "code_terms": (0.973, -0.038, -1.695),
    "code_ask": (1.580, -0.035, -0.638),
    "stub": (1.481, -0.004, -0.141),
    "doc_markers": (0.129, 1.290, -0.515),
    "rag_terms": (-0.231, 0.874, 0.020),
    "rag_phrases": (-0.313, 1.078, -0.753),
    "qa_labels": (-0.449, 1.796, 0.526),
    "length": (1.790, 1.355, 0.807),
    "tail_question": (0.047, 0.877, -0.112),
    "write_verb": (0.552, -0.080, 0.274),
    "roleplay": (0.176, 0.018, 1.307),
    "creative_nouns": (-0.399, 0.333, 1.652),
    "creative_ask": (-0.256, -0.060, 0.753),
    "fiction": (-1.006, 0.132, 0.951),
    "style": (0.061, -0.034, 0.188),
    "length_spec": (0.593, -0.021, 0.649),
    "chat_verb": (-0.271, 0.730, -1.136),
    "question_start": (0.410, -0.241, -1.227),
    "question_mark": (-0.459, 0.452, -0.713),
    "short": (-0.723, -0.296, -0.321),
}
# Hand weights for signals absent from the development set.
HAND_WEIGHTS: dict[str, tuple[float, float, float]] = {
    "structured": (5.0, -1.0, -2.0),  # tools / JSON output: low-entropy like code
    "context_turn": (-1.0, 5.5, -1.0),  # documents in system/earlier turns, short question
}


@dataclass(frozen=True, slots=True)
class TaskGuess:
    """A task decision: ``task`` in TASKS, ``confidence`` in 0..1 (the model's probability
    of that task), ``features`` the non-zero features and class probabilities behind it."""

    task: str
    confidence: float
    features: dict[str, float]


def _code_features(rt: RequestText, w: frozenset[str], iw: frozenset[str]) -> dict[str, float]:
    text = rt.text
    raw = text.encode()
    n = max(len(raw), 1)
    syntax = (n - len(raw.translate(None, _SYNTAX))) / n
    lines = text.count("\n") + 1
    indent = (text.count("\n    ") + text.count("\n\t")) / lines if lines >= 3 else 0.0
    tokens = len(w & lx.CODE_TOKENS) + sum(s in text for s in lx.CODE_SUBSTRINGS)
    langs = len(iw & lx.CODE_LANGS) + sum(s in rt.instr for s in lx.CODE_SUBSTRINGS[:3])
    objects = iw & lx.CODE_OBJECTS if langs else iw & lx.CODE_OBJECTS - {"script"}
    return {
        "syntax": min(10.0 * syntax, 3.0),
        "indent": indent,
        "fence": 1.0 if "```" in text else 0.0,
        "code_tokens": math.log1p(tokens),
        "code_langs": min(float(langs), 2.0),
        "code_terms": math.log1p(len(iw & lx.CODE_TERMS)),
        "code_ask": 1.0 if iw & lx.CODE_VERBS and (langs or objects) else 0.0,
        "stub": 1.0 if _STUB.match(rt.head) or '"""' in text or ">>> " in text else 0.0,
    }


def _is_context(rt: RequestText) -> bool:
    """Supplied material (not a persona prompt) of 1,000+ chars before a short final message.

    Instructions address the model ("you", "your") several times per 1,000 characters;
    documents, passages and search results rarely do.
    """
    if rt.context_chars < 1000 or rt.last_chars > 600 or rt.split < 500:
        return False
    return rt.text.count("you", 0, rt.split) * 1000 < 4 * rt.split


def _rag_features(rt: RequestText, w: frozenset[str], iw: frozenset[str]) -> dict[str, float]:
    text, instr = rt.text, rt.instr
    phrases = sum(p in instr for key, group in _PHRASE_GROUPS if key in iw for p in group)
    terms = len(w & lx.RAG_TERMS)
    if not instr.isascii():
        terms += len(lx.RAG_NON_LATIN.findall(instr))
    total = rt.last_chars + rt.context_chars
    last_len = rt.last_chars / 1000
    tail_q = total >= 1500 and ("?" in rt.tail or "question" in rt.tail)
    last_q = "?" in rt.tail or rt.head.startswith(lx.QUESTION_STARTS)
    return {
        "doc_markers": min(math.log1p(len(lx.DOC_MARKERS.findall("\n" + text))), 3.0),
        "rag_terms": math.log1p(terms),
        "rag_phrases": math.log1p(phrases),
        "qa_labels": min(float(sum(instr.count(q) for q in lx.QA_LABELS)), 3.0),
        "length": min(math.log2(last_len), 4.0) if last_len > 1 else 0.0,
        "tail_question": 1.0 if tail_q else 0.0,
        "context_turn": 1.0 if last_q and _is_context(rt) else 0.0,
    }


def _creative_features(rt: RequestText, w: frozenset[str], iw: frozenset[str]) -> dict[str, float]:
    instr = rt.instr
    nouns = len(iw & lx.CREATIVE_NOUNS) + sum(s in instr for s in lx.CREATIVE_SUBSTRINGS)
    if "script" in iw and iw & lx.CODE_LANGS:
        nouns -= 1  # "a python script" is code, "a script where ..." is a screenplay
    if not instr.isascii():
        nouns += len(lx.CREATIVE_NON_LATIN.findall(instr))
    write = bool(lx.words(rt.head[:60]) & lx.WRITE_VERBS)
    if not write and not rt.head.isascii():
        write = lx.WRITE_NON_LATIN.search(rt.head) is not None
    roleplay = len(iw & lx.ROLEPLAY_WORDS) + sum(p in instr for p in lx.ROLEPLAY_PHRASES)
    return {
        "write_verb": 1.0 if write else 0.0,
        "roleplay": min(float(roleplay), 2.0),
        "creative_nouns": min(float(nouns), 3.0),
        "creative_ask": 1.0 if nouns and iw & lx.CREATIVE_VERBS else 0.0,
        "fiction": math.log1p(len(w & lx.FICTION_TERMS)),
        "style": min(float(len(iw & lx.STYLE_WORDS)), 2.0),
        "length_spec": 1.0 if lx.LENGTH_SPEC.search(instr) else 0.0,
    }


def _chat_features(rt: RequestText) -> dict[str, float]:
    opening = lx.words(rt.head[:60])
    return {
        "chat_verb": 1.0 if opening & lx.CHAT_VERBS else 0.0,
        "question_start": 1.0 if rt.head.lstrip().startswith(lx.QUESTION_STARTS) else 0.0,
        "question_mark": 1.0 if "?" in rt.head or "?" in rt.tail else 0.0,
        "short": 1.0 if rt.last_chars + rt.context_chars < 200 else 0.0,
    }


def extract_features(body: Mapping[str, Any]) -> dict[str, float] | None:
    """Named feature values (mostly 0..3) of a request body, or None if it has no readable text.

    ``body``: a parsed ``/v1/completions`` or ``/v1/chat/completions`` JSON body. Reads at
    most a few thousand characters whatever the body's size.
    """
    rt = read_request(body)
    if rt is None:
        return None
    w = lx.words(rt.text)
    iw = lx.words(rt.instr)
    feats = _code_features(rt, w, iw)
    feats.update(_rag_features(rt, w, iw))
    feats.update(_creative_features(rt, w, iw))
    feats.update(_chat_features(rt))
    feats["structured"] = 1.0 if rt.structured else 0.0
    return feats


def probabilities(
    feats: Mapping[str, float],
    weights: Mapping[str, tuple[float, float, float]] | None = None,
    bias: tuple[float, float, float] | None = None,
) -> dict[str, float]:
    """Softmax probability of each task in TASKS given ``feats`` (default: shipped weights)."""
    weights = WEIGHTS if weights is None else weights
    logits = list(BIAS if bias is None else bias)
    for name, value in feats.items():
        if value:
            wt = weights.get(name) or HAND_WEIGHTS.get(name)
            if wt is not None:
                logits[0] += wt[0] * value
                logits[1] += wt[1] * value
                logits[2] += wt[2] * value
    scores = {"code": logits[0], "rag": logits[1], "chat": 0.0, "creative": logits[2]}
    top = max(scores.values())
    exp = {task: math.exp(s - top) for task, s in scores.items()}
    total = sum(exp.values())
    return {task: e / total for task, e in exp.items()}


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
    shown = {name: round(value, 3) for name, value in feats.items() if value}
    shown.update({f"p_{t}": round(p, 3) for t, p in probs.items()})
    return TaskGuess(task, round(probs[task], 4), shown)
