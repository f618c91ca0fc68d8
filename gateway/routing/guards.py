"""Known engine bugs (config ``guards``): which candidate backends a request must avoid.

Pure code. A guard matches a request when every field it names is present (not null; a
``seed`` of -1 is vLLM's "no seed"), it samples or not as ``samples`` asks (vLLM's rule:
:func:`~gateway.classify.features.samples`), and its prompt reaches ``min_prompt_tokens``:
the exact count when the caller has it (the gateway asks a backend's ``/tokenize`` when
:func:`needs_token_count` says the cheap bound alone would match), else the bound
(:func:`prompt_tokens_bound`). Applied to a routing decision, an ``avoid`` guard removes the
affected backends from the try list, a ``refuse`` guard refuses the request; so does an
empty list left by avoiding. Every function takes the client's body as a plain mapping, of
any endpoint (routed or relayed).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from contracts.config import GatewayConfig, Guard
from gateway.classify.features import samples
from gateway.routing.policy import RouteDecision

#: Tokens allowed for what a chat template adds outside the messages' own JSON: BOS, the
#: generation prompt, a default system line (SmolLM2's ChatML template adds one of ~15
#: tokens), Llama 3.1's date header and tool-use instructions (~80 tokens).
TEMPLATE_TOKENS = 256


def prompt_tokens_bound(body: Mapping[str, Any]) -> int:
    """An upper bound of the prompt tokens of any generating request body: the UTF-8 bytes
    of the whole body serialized as JSON, plus :data:`TEMPLATE_TOKENS`.

    Why it bounds: every prompt token comes from a body field (``prompt`` strings or token
    ids, ``messages`` of any content-part type with names, tool calls and ``tools``,
    ``documents``, Responses ``input`` + ``instructions``, Anthropic ``system`` and
    blocks, the bodies of ``/invocations`` and ``/v1/chat/completions/batch``) or from the
    chat template's own text. A byte-level BPE tokenizer (GPT-2, Llama 3, SmolLM2) makes at
    least one byte per token (SentencePiece with byte fallback too, plus one prefix space
    per segment, covered by the quotes around it); a token id is at least one JSON digit;
    a template renders a message's role and content, or a tool as JSON, from text that is
    in the body's JSON with its keys and quotes (more bytes than the template's per-message
    markers, e.g. ChatML's ``<|im_start|>user`` + newlines, 5 tokens, against the 20+ bytes
    of ``{"role":"user","content":""}``). Fields that are not prompt (``max_tokens``,
    ``stop``, a JSON schema) only make the bound looser. A custom template with more literal
    text than :data:`TEMPLATE_TOKENS` is the one case it does not cover.
    """
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"), default=str)
    return len(text.encode("utf-8", "surrogatepass")) + TEMPLATE_TOKENS


def _present(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name)
    if name == "seed" and value == -1:  # vLLM: seed -1 is no seed
        return False
    return value is not None


def matches(
    guard: Guard,
    body: Mapping[str, Any],
    prompt_tokens: int | None = None,
    default_temperature: float = 1.0,
) -> bool:
    """Whether ``body`` has ``guard``'s shape (cheap field checks first); ``prompt_tokens``:
    the exact count when known (else :func:`prompt_tokens_bound` stands in);
    ``default_temperature``: the config's ``defaults.temperature`` (a request without one
    samples at it)."""
    if not all(_present(body, name) for name in guard.match.fields):
        return False
    wanted = guard.match.samples
    if wanted is not None and samples(body, default_temperature) != wanted:
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
    default = config.defaults.temperature
    return any(
        config.guards[g].match.min_prompt_tokens is not None
        and matches(config.guards[g], body, None, default)
        for g in names
    )


@dataclass(frozen=True, slots=True)
class GuardVerdict:
    """The decision with affected backends removed (``decision.guarded`` lists them), which
    guard hit which backend, and the guard that refuses the request (None: it may be
    served, or its try list is empty because the backends without the bug are down: the
    caller's 503)."""

    decision: RouteDecision
    hits: tuple[tuple[str, str], ...] = ()
    refused_by: str | None = None


def _hit(
    config: GatewayConfig, backend: str, body: Mapping[str, Any], prompt_tokens: int | None
) -> str | None:
    """The first guard of ``backend`` that ``body`` matches (None: none)."""
    default = config.defaults.temperature
    return next(
        (
            g
            for g in config.backends[backend].guards
            if matches(config.guards[g], body, prompt_tokens, default)
        ),
        None,
    )


def apply_guards(
    config: GatewayConfig,
    decision: RouteDecision,
    body: Mapping[str, Any],
    prompt_tokens: int | None = None,
) -> GuardVerdict:
    """Apply the guards of ``decision``'s candidate backends to ``body`` (``prompt_tokens``:
    the exact prompt length when known).

    When avoiding leaves no backend, the request is refused (400 ``engine_bug_guard``) only
    if no backend the rule considered is free of the bug; when one is but cannot serve now
    (unhealthy, circuit open, at its cap), the try list is left empty and the caller
    answers 503 (or 429) as for any outage: a client retrying later gets an answer."""
    kept, hits, refused_by = [], [], None
    for backend in decision.backends:
        hit = _hit(config, backend, body, prompt_tokens)
        if hit is None:
            kept.append(backend)
            continue
        hits.append((backend, hit))
        if config.guards[hit].action == "refuse" and refused_by is None:
            refused_by = hit
    if not hits:
        return GuardVerdict(decision)
    if not kept and refused_by is None:
        down = {c.backend for c in decision.candidates} - set(decision.backends)
        if not any(b in config.backends and _hit(config, b, body, prompt_tokens) is None
                   for b in down):  # fmt: skip
            refused_by = hits[0][1]
    reasons = tuple(
        f"{b}: avoided, known engine bug '{g}'{_why(config.guards[g])}" for b, g in hits
    )
    hit_by = dict(hits)
    candidates = tuple(
        replace(c, kept=False, why=f"avoided: known engine bug '{hit_by[c.backend]}'")
        if c.backend in hit_by
        else c
        for c in decision.candidates
    )
    guarded = replace(
        decision,
        backends=tuple(kept),
        candidates=candidates,
        reasons=decision.reasons + reasons,
        guarded=tuple(hits),
    )
    return GuardVerdict(guarded, tuple(hits), refused_by)


def _why(guard: Guard) -> str:
    """The condition that hit, for reasons and headers (e.g. ``(seed, samples, prompt >=
    1024 tokens)``)."""
    parts = list(guard.match.fields)
    if guard.match.samples is not None:
        parts.append("samples" if guard.match.samples else "greedy")
    if guard.match.min_prompt_tokens is not None:
        parts.append(f"prompt >= {guard.match.min_prompt_tokens} tokens")
    return f" ({', '.join(parts)})" if parts else ""
