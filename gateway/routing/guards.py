"""Known engine bugs (config ``guards``): which candidate backends a request must avoid.

Pure code. A guard matches a request when every field it names is present (not null) and
its prompt reaches ``min_prompt_tokens``: the exact count when the caller has it (the
gateway asks a backend's ``/tokenize`` when :func:`needs_token_count` says the cheap bound
alone would match), else the bound (:func:`prompt_tokens_bound`). Applied to a
routing decision, an ``avoid`` guard removes the affected backends from the try list, a
``refuse`` guard refuses the request; so does an empty list left by avoiding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from contracts.config import GatewayConfig, Guard
from gateway.routing.policy import RouteDecision

#: Tokens allowed per chat message for its template (role markers, separators).
TEMPLATE_TOKENS_PER_MESSAGE = 8


def prompt_tokens_bound(body: Mapping[str, Any]) -> int:
    """An upper bound of the prompt's tokens for a byte-level BPE tokenizer: UTF-8 bytes of
    ``prompt`` (or the number of token ids) or of every ``messages`` text part, plus
    :data:`TEMPLATE_TOKENS_PER_MESSAGE` per message."""
    prompt = body.get("prompt")
    if prompt is not None:
        return _size(prompt)
    messages = body.get("messages")
    if not isinstance(messages, list):
        return 0
    total = 0
    for message in messages:
        total += TEMPLATE_TOKENS_PER_MESSAGE
        if isinstance(message, Mapping):
            total += _size(message.get("content"))
    return total


def _size(value: Any) -> int:
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, int):
        return 1  # a token id
    if isinstance(value, list):
        return sum(_size(v) for v in value)
    if isinstance(value, Mapping):
        return _size(value.get("text"))
    return 0


def matches(guard: Guard, body: Mapping[str, Any], prompt_tokens: int | None = None) -> bool:
    """Whether ``body`` has ``guard``'s shape (cheap field checks first); ``prompt_tokens``:
    the exact count when known (else :func:`prompt_tokens_bound` stands in)."""
    if any(body.get(name) is None for name in guard.match.fields):
        return False
    least = guard.match.min_prompt_tokens
    if least is None:
        return True
    return (prompt_tokens_bound(body) if prompt_tokens is None else prompt_tokens) >= least


def needs_token_count(
    config: GatewayConfig, decision: RouteDecision, body: Mapping[str, Any]
) -> bool:
    """Whether a candidate's guard matches ``body`` only by the token bound: then the exact
    count (the backend's ``/tokenize``) is worth asking for before deciding."""
    names = {g for b in decision.backends for g in config.backends[b].guards}
    return any(
        config.guards[g].match.min_prompt_tokens is not None and matches(config.guards[g], body)
        for g in names
    )


@dataclass(frozen=True, slots=True)
class GuardVerdict:
    """The decision with affected backends removed, which guard hit which backend, and the
    guard that refuses the request (None: it may be served)."""

    decision: RouteDecision
    hits: tuple[tuple[str, str], ...] = ()
    refused_by: str | None = None


def apply_guards(
    config: GatewayConfig,
    decision: RouteDecision,
    body: Mapping[str, Any],
    prompt_tokens: int | None = None,
) -> GuardVerdict:
    """Apply the guards of ``decision``'s candidate backends to ``body`` (``prompt_tokens``:
    the exact prompt length when known)."""
    kept, hits, refused_by = [], [], None
    for backend in decision.backends:
        hit = next(
            (
                g
                for g in config.backends[backend].guards
                if matches(config.guards[g], body, prompt_tokens)
            ),
            None,
        )
        if hit is None:
            kept.append(backend)
            continue
        hits.append((backend, hit))
        if config.guards[hit].action == "refuse" and refused_by is None:
            refused_by = hit
    if not hits:
        return GuardVerdict(decision)
    if not kept and refused_by is None:
        refused_by = hits[0][1]
    reasons = tuple(f"{b}: avoided, known engine bug '{g}'" for b, g in hits)
    guarded = replace(decision, backends=tuple(kept), reasons=decision.reasons + reasons)
    return GuardVerdict(guarded, tuple(hits), refused_by)
