"""Named, bounded-cost signals of a request's task, for the task classifier.

Every feature is a small float (mostly 0..3) computed from the bounded text views of
``gateway.classify.text``: C-level scans of at most a few thousand characters, set
intersections with the word lists of ``gateway.classify.lexicon``, a few anchored or
literal-prefixed regexes. Pure functions, no state.
"""

from __future__ import annotations

import math
import re

from gateway.classify import lexicon as lx
from gateway.classify.text import RequestText

FEATURES = (
    # code
    "syntax", "indent", "fence", "code_tokens", "code_langs", "code_terms", "code_ask", "stub",
    # rag
    "doc_markers", "rag_terms", "rag_phrases", "qa_labels", "length", "tail_question",
    "context_turn",
    # creative
    "write_verb", "roleplay", "creative_nouns", "creative_ask", "fiction", "style",
    "length_spec", "narrative",
    # chat
    "info_words", "chat_verb", "question_start", "question_mark", "short",
    # supplied material
    "doc_tags", "tool_material",
)  # fmt: skip

_SYNTAX = b"{}();=<>[]_"  # bytes frequent in source code, rare in prose
_SQL = (b"SELECT ", b" FROM ", b" WHERE ", b"JOIN ", b"GROUP BY", b"INSERT INTO")  # upper case
_STUB = re.compile(
    r"\s*(?:def \w+\s*\(|class \w+\s*[:(]|import \w|from [\w.]+ import |#include|package \w"
    r"|<\?php|#!/|(?:const|let|var) \w+\s*=|fn \w+\s*\(|func \w+\s*\(|public (?:class|static)"
    r"|(?:async )?function\s*\w*\s*\()"
)


def _code(rt: RequestText, words: frozenset[str]) -> dict[str, float]:
    raw = rt.text.encode("utf-8", "surrogatepass")  # lone surrogates from JSON escapes
    n = len(raw) or 1
    syntax = (n - len(raw.translate(None, _SYNTAX))) / n
    lines = raw.count(b"\n") + 1
    indent = (raw.count(b"\n    ") + raw.count(b"\n\t")) / lines if lines >= 3 else 0.0
    langs = len(words & lx.CODE_LANGS) + lx.count_phrases(rt.instr, words, lx.LANG_PHRASE_GROUPS)
    objects = words & lx.CODE_OBJECTS if langs else words & lx.CODE_OBJECTS - {"script"}
    tokens = len(words & lx.CODE_TOKENS)
    if words & lx.SQL_KEYS:
        tokens += sum(k in raw for k in _SQL)
    stub = _STUB.match(rt.head) or raw.find(b'"""', 0, 1500) >= 0 or raw.find(b">>> ", 0, 1500) >= 0
    return {
        "syntax": min(10.0 * syntax, 3.0),
        "indent": indent,
        "fence": 1.0 if b"```" in raw else 0.0,
        "code_tokens": math.log1p(tokens),
        "code_langs": min(float(langs), 2.0),
        "code_terms": math.log1p(len(words & lx.CODE_TERMS)),
        "code_ask": 1.0 if words & lx.CODE_VERBS and (langs or objects) else 0.0,
        "stub": 1.0 if stub else 0.0,
    }


def _is_context(rt: RequestText) -> bool:
    """Supplied material (not a persona prompt) of 1,000+ chars before a short final message.

    Instructions address the model ("you", "your") several times per 1,000 characters;
    documents, passages and search results rarely do. Tool results of 1,000+ characters
    (search hits, retrieved records) are material too.
    """
    if rt.context_chars < 1000 or rt.last_chars > 600:
        return False
    if rt.tool_chars >= 1000:
        return True
    if rt.split < 500:
        return False
    text, end = rt.text, rt.split
    return (text.count("you", 0, end) + text.count("You", 0, end)) * 1000 < 4 * end


def _rag(rt: RequestText, words: frozenset[str], other: dict[str, int]) -> dict[str, float]:
    instr = rt.instr
    phrases = lx.count_phrases(instr, words, lx.RAG_PHRASE_GROUPS) + other["rag_phrases"]
    terms = len(words & lx.RAG_TERMS) + other["rag_terms"]
    labels = other["qa_labels"]
    for key, label in lx.QA_LABELS:
        if key in words:
            labels += instr.count(label)
    kilochars = rt.last_chars / 1000
    tail_q = rt.last_chars + rt.context_chars >= 1000 and ("?" in rt.tail or "question" in rt.tail)
    last_q = "?" in rt.tail or rt.head.startswith(lx.QUESTION_STARTS)
    return {
        "doc_markers": min(math.log1p(len(lx.DOC_MARKERS.findall("\n" + rt.text))), 3.0),
        "doc_tags": min(math.log1p(rt.doc_tags), 3.0),
        "tool_material": min(math.log1p(rt.tool_chars / 1000), 3.0),
        "rag_terms": math.log1p(terms),
        "rag_phrases": math.log1p(phrases),
        "qa_labels": min(float(labels), 3.0),
        "length": min(math.log2(kilochars), 4.0) if kilochars > 1 else 0.0,
        "tail_question": 1.0 if tail_q else 0.0,
        "context_turn": 1.0 if last_q and _is_context(rt) else 0.0,
    }


def _creative(
    rt: RequestText, words: frozenset[str], opening: frozenset[str], other: dict[str, int]
) -> dict[str, float]:
    instr = rt.instr
    nouns = len(words & lx.CREATIVE_NOUNS) + other["creative_nouns"]
    nouns += lx.count_phrases(instr, words, lx.CREATIVE_PHRASE_GROUPS)
    if "script" in words and words & lx.CODE_LANGS:
        nouns -= 1  # "a python script" is code, "a script where ..." is a screenplay
    write = bool(opening & lx.WRITE_VERBS)
    if not write and not rt.head.isascii():
        write = lx.WRITE_NON_LATIN.search(rt.head) is not None
    roleplay = len(words & lx.ROLEPLAY_WORDS)
    roleplay += lx.count_phrases(instr, words, lx.ROLEPLAY_PHRASE_GROUPS)
    return {
        "write_verb": 1.0 if write else 0.0,
        "roleplay": min(float(roleplay), 2.0),
        "creative_nouns": min(float(nouns), 3.0),
        "creative_ask": 1.0 if nouns > 0 and words & lx.CREATIVE_VERBS else 0.0,
        "fiction": math.log1p(len(words & lx.FICTION_TERMS)),
        "style": min(float(len(words & lx.STYLE_WORDS)), 2.0),
        "length_spec": 1.0 if lx.has_length_spec(instr, words) else 0.0,
        "narrative": min(float(len(words & lx.NARRATIVE_PRONOUNS)), 2.0),
    }


def _chat(rt: RequestText, words: frozenset[str], opening: frozenset[str]) -> dict[str, float]:
    return {
        "info_words": min(float(len(words & lx.INFO_WORDS)), 2.0),
        "chat_verb": 1.0 if opening & lx.CHAT_VERBS else 0.0,
        "question_start": 1.0 if rt.head.lstrip().startswith(lx.QUESTION_STARTS) else 0.0,
        "question_mark": 1.0 if "?" in rt.head or "?" in rt.tail else 0.0,
        "short": 1.0 if rt.last_chars + rt.context_chars < 200 else 0.0,
    }


def read_signals(rt: RequestText) -> tuple[dict[str, float], frozenset[str]]:
    """Every feature in FEATURES for the bounded text ``rt``, and its terms for word weights:
    the distinct lower-case tokens of its instruction window (see ``RequestText.instr``) and the
    first three tokens of the final message as ``^word``.

    Word features come from the instruction window, which keeps document and code bodies from
    voting with their incidental vocabulary; named features look at ``lexicon.VOCABULARY`` only.
    """
    tokens = frozenset(lx.tokens(rt.instr))
    words = lx.VOCABULARY & tokens
    terms = tokens.union(["^" + t for t in lx.tokens(rt.head[:40])[:3]])  # how it opens
    opening = lx.VOCABULARY.intersection(lx.tokens(rt.head[:60]))  # known opening words
    other = lx.count_non_latin(rt.instr)
    feats = _code(rt, words)
    feats.update(_rag(rt, words, other))
    feats.update(_creative(rt, words, opening, other))
    feats.update(_chat(rt, words, opening))
    return feats, terms
