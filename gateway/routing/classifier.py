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
FEATURES = (
    "syntax", "indent", "fence", "code_tokens", "code_langs", "code_terms", "code_ask", "stub",
    "doc_markers", "rag_terms", "rag_phrases", "qa_labels", "length", "tail_question",
    "context_turn", "write_verb", "roleplay", "creative_nouns", "creative_ask", "fiction", "style", "length_spec", "narrative", "info_words", "chat_verb", "question_start", "question_mark", "short",
    "structured",
)  # fmt: skip

_SYNTAX = b"{}();=<>[]_"
_STUB = re.compile(
    r"\s*(?:def \w+\s*\(|class \w+\s*[:(]|import \w|from [\w.]+ import |#include|package \w"
    r"|<\?php|#!/|(?:const|let|var) \w+\s*=|fn \w+\s*\(|func \w+\s*\(|public (?:class|static)"
    r"|(?:async )?function\s*\w*\s*\()"
)
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
# Hand-set (code, creative) weights of signals the development set does not contain.
HAND_WEIGHTS: dict[str, tuple[float, float]] = {
    "structured": (5.0, -2.0),  # tools / JSON output: low-entropy output, like code
    # The development chat class holds ~20 programming requests (AlpacaEval, MT-Bench); fitted,
    # these weights learn to discount language names and "write a function", wrong for routing.
    "code_langs": (2.0, -1.0),
    "code_ask": (2.0, -1.0),
    "context_turn": (-1.0, -1.0),
}
# Fitted by `python -m bench.classify --fit`: feature -> (code, creative) log-odds vs chat.
BIAS: tuple[float, float] = (-2.208, -0.599)
WEIGHTS: dict[str, tuple[float, float]] = {
    "syntax": (2.240, -0.955),
    "indent": (1.577, 0.115),
    "fence": (-0.797, -0.000),
    "code_tokens": (1.208, 0.244),
    "code_terms": (0.826, -1.241),
    "stub": (1.550, -0.098),
    "doc_markers": (-0.032, -0.653),
    "rag_terms": (-0.270, 0.012),
    "rag_phrases": (-0.249, -0.608),
    "qa_labels": (-0.313, 0.124),
    "length": (1.908, 0.701),
    "tail_question": (-0.276, 0.153),
    "write_verb": (0.210, 0.473),
    "roleplay": (0.243, 1.348),
    "creative_nouns": (-0.151, 1.547),
    "creative_ask": (-0.388, 0.747),
    "fiction": (-0.778, 0.815),
    "style": (0.027, 0.463),
    "length_spec": (0.269, 0.811),
    "narrative": (-0.430, 0.434),
    "info_words": (0.255, -1.017),
    "chat_verb": (-1.128, -1.396),
    "question_start": (0.419, -1.940),
    "question_mark": (-0.545, -0.872),
    "short": (-0.679, -0.311),
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
    langs = len(iw & lx.CODE_LANGS) + sum(s in rt.instr for s in lx.LANG_SUBSTRINGS)
    objects = iw & lx.CODE_OBJECTS if langs else iw & lx.CODE_OBJECTS - {"script"}
    return {
        "syntax": min(10.0 * syntax, 3.0),
        "indent": indent,
        "fence": 1.0 if "```" in text else 0.0,
        "code_tokens": math.log1p(len(w & lx.CODE_TOKENS)),
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
    phrases = lx.count_phrases(instr, iw, lx.RAG_PHRASE_GROUPS)
    terms = len(w & lx.RAG_TERMS)
    labels = sum(instr.count(label) for key, label in lx.QA_LABELS if key in iw)
    if not instr.isascii():
        terms += len(lx.RAG_NON_LATIN.findall(instr))
        phrases += len(lx.RAG_NON_LATIN_PHRASES.findall(instr))
        labels += len(lx.QA_NON_LATIN.findall(instr))
    total = rt.last_chars + rt.context_chars
    last_len = rt.last_chars / 1000
    tail_q = total >= 1000 and ("?" in rt.tail or "question" in rt.tail)
    last_q = "?" in rt.tail or rt.head.startswith(lx.QUESTION_STARTS)
    return {
        "doc_markers": min(math.log1p(len(lx.DOC_MARKERS.findall("\n" + text))), 3.0),
        "rag_terms": math.log1p(terms),
        "rag_phrases": math.log1p(phrases),
        "qa_labels": min(float(labels), 3.0),
        "length": min(math.log2(last_len), 4.0) if last_len > 1 else 0.0,
        "tail_question": 1.0 if tail_q else 0.0,
        "context_turn": 1.0 if last_q and _is_context(rt) else 0.0,
    }


def _creative_features(rt: RequestText, w: frozenset[str], iw: frozenset[str]) -> dict[str, float]:
    instr = rt.instr
    nouns = len(iw & lx.CREATIVE_NOUNS) + lx.count_phrases(instr, iw, lx.CREATIVE_PHRASE_GROUPS)
    if "script" in iw and iw & lx.CODE_LANGS:
        nouns -= 1  # "a python script" is code, "a script where ..." is a screenplay
    ascii_only = instr.isascii()
    if not ascii_only:
        nouns += len(lx.CREATIVE_NON_LATIN.findall(instr))
    write = bool(lx.words(rt.head[:60]) & lx.WRITE_VERBS)
    if not write and not rt.head.isascii():
        write = lx.WRITE_NON_LATIN.search(rt.head) is not None
    roleplay = len(iw & lx.ROLEPLAY_WORDS) + lx.count_phrases(instr, iw, lx.ROLEPLAY_PHRASE_GROUPS)
    sized = lx.has_length_spec(instr, iw)
    return {
        "write_verb": 1.0 if write else 0.0,
        "roleplay": min(float(roleplay), 2.0),
        "creative_nouns": min(float(nouns), 3.0),
        "creative_ask": 1.0 if nouns and iw & lx.CREATIVE_VERBS else 0.0,
        "fiction": math.log1p(len(w & lx.FICTION_TERMS)),
        "style": min(float(len(iw & lx.STYLE_WORDS)), 2.0),
        "length_spec": 1.0 if sized else 0.0,
        "narrative": min(float(len(iw & lx.NARRATIVE_PRONOUNS)), 2.0),
    }


def _chat_features(rt: RequestText, iw: frozenset[str]) -> dict[str, float]:
    opening = lx.words(rt.head[:60])
    return {
        "info_words": min(float(len(iw & lx.INFO_WORDS)), 2.0),
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
    feats.update(_chat_features(rt, iw))
    feats["structured"] = 1.0 if rt.structured else 0.0
    return feats


def probabilities(
    feats: Mapping[str, float],
    weights: Mapping[str, tuple[float, float]] | None = None,
    bias: tuple[float, float] | None = None,
) -> dict[str, float]:
    """Softmax probability of each task in TASKS given ``feats``.

    ``weights``/``bias``: the fitted (code, creative) columns, default the shipped ones; the
    rag column and the hand weights are fixed.
    """
    weights = WEIGHTS if weights is None else weights
    code, creative = BIAS if bias is None else bias
    rag = RAG_BIAS
    for name, value in feats.items():
        if value:
            wt = weights.get(name) or HAND_WEIGHTS.get(name)
            if wt is not None:
                code += wt[0] * value
                creative += wt[1] * value
            rag += RAG_WEIGHTS.get(name, 0.0) * value
    scores = {"code": code, "rag": rag, "chat": 0.0, "creative": creative}
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
