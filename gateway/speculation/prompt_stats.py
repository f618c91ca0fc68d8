"""Cheap prompt statistics that predict how well speculation will do on a request.

ngram prompt lookup (vLLM ``method: ngram``) drafts by finding the last 2-4 tokens of the
context earlier in the context and proposing what followed them; it is accepted when the
answer repeats text the context already holds. How much the prompt repeats itself is a cheap
proxy: the share of word bigrams in the prompt that occurred before in it (repeated
identifiers, quoted passages, templated records).

Bounded work on the event loop: the text comes from :func:`gateway.classify.text.read_request`
(head/tail slices, at most about 3,800 characters) and only its last ``max_chars`` characters
are split into words (about 10 microseconds for 1,000 characters).
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.classify.text import RequestText

#: Fewer word bigrams than this give no meaningful repeat share (reported as 0.0).
MIN_BIGRAMS = 8


@dataclass(frozen=True, slots=True)
class PromptStats:
    """What routing knows about a prompt's shape.

    ``chars``: its length in characters (final user message plus the examined context
    messages, or the completions prompt); ``overlap``: share in [0, 1] of the word bigrams of
    the examined slice that repeat an earlier bigram of it (None when the prompt is not text,
    e.g. token ids).
    """

    chars: int
    overlap: float | None


def self_overlap(text: str, max_chars: int = 1000) -> float:
    """Share of repeated word bigrams in the last ``max_chars`` characters of ``text``.

    ``1 - distinct bigrams / bigrams``: 0.0 when no bigram repeats (or the slice is too
    short), approaching 1.0 for text that is one phrase over and over.
    """
    words = text[-max_chars:].split()
    total = len(words) - 1
    if total < MIN_BIGRAMS:
        return 0.0
    return 1.0 - len(set(zip(words, words[1:], strict=False))) / total


def stats_of(text: RequestText | None, max_chars: int = 1000) -> PromptStats:
    """The :class:`PromptStats` of text already read from a body (``read_request(body)``,
    None when it had no readable text)."""
    if text is None:
        return PromptStats(chars=0, overlap=None)
    return PromptStats(
        chars=text.last_chars + text.context_chars,
        overlap=round(self_overlap(text.text, max_chars), 4),
    )
