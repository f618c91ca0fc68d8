"""OpenAI-compatible endpoints: ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``.

Handlers only parse, route and relay: the body bytes the client sent are what the backend
receives; the response carries ``x-specgate-backend``, ``x-specgate-rule``,
``x-specgate-task`` and ``x-request-id``.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from gateway.api.deps import ForwarderDep, GatewayDep, SettingsDep
from gateway.errors import GatewayError, bad_request, no_backend, too_busy
from gateway.protocol import (
    ChatCompletionFields,
    CompletionFields,
    openapi_body,
    validate_fields,
)
from gateway.routing.policy import RouteDecision
from gateway.service import Gateway
from gateway.settings import Settings
from gateway.trace import RequestTrace
from gateway.upstream.feedback import ResponseTap, with_usage
from gateway.upstream.forward import Forwarder, read_all

router = APIRouter(tags=["openai"])


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, at most ``limit`` bytes; raises 413 past it."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> GatewayError:
    return GatewayError(
        413, f"The request body is larger than {limit} bytes.", code="request_too_large"
    )


def parse_json(raw: bytes) -> Any:
    """Decode a JSON body; malformed JSON, invalid UTF-8 or absurd nesting is a 400."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise bad_request("The request body is not valid JSON.", code="invalid_json") from None


async def _proxy(
    request: Request,
    gateway: Gateway,
    forwarder: Forwarder,
    settings: Settings,
    kind: type[CompletionFields] | type[ChatCompletionFields],
    path: str,
) -> Response:
    request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
    trace = gateway.new_trace(request_id, path)
    try:
        if sum(len(k) + len(v) for k, v in request.scope["headers"]) > settings.max_header_bytes:
            raise GatewayError(431, "The request headers are too large.", code="headers_too_large")
        if gateway.inflight >= settings.max_inflight:
            raise too_busy(f"The gateway has {settings.max_inflight} requests in flight.")
        gateway.inflight += 1
        trace.observers = [*trace.observers, gateway.on_request_done]
        return await _route_and_forward(request, gateway, forwarder, settings, kind, path, trace)
    except GatewayError as exc:
        trace.finish(exc.status, exc.code)
        raise


async def _route_and_forward(
    request: Request,
    gateway: Gateway,
    forwarder: Forwarder,
    settings: Settings,
    kind: type[CompletionFields] | type[ChatCompletionFields],
    path: str,
    trace: RequestTrace,
) -> Response:
    raw = await read_body(request, settings.max_body_bytes)
    body = parse_json(raw)
    fields = validate_fields(kind, body)
    trace.stream = bool(fields.stream)
    features = gateway.features(body, fields.model, request.headers.get("x-task-type"))
    prompt = gateway.prompt_stats(body)
    decision = gateway.decide(features, prompt)
    trace.task, trace.rule = features.task, decision.rule
    trace.features, trace.prompt = features, prompt
    if not decision.backends:
        gateway.stats.rejected += 1
        if decision.saturated:
            raise too_busy("Every backend for this request is at its in-flight cap.")
        raise no_backend()
    headers = dict(request.headers) | {"x-request-id": trace.request_id}
    tap = None
    if gateway.config.routing.feedback:
        # A stream ends with the usage chunk (and vLLM's per-request acceptance) only if
        # asked for: ask, uncompressed, and the tap removes it again (gateway.upstream.feedback).
        forced = with_usage(raw, body)
        if forced is not None:
            raw, headers["accept-encoding"] = forced, "identity"
        tap = ResponseTap(trace, strip=forced is not None)
    # Forward inline (the in-flight count moves in the same step as the decision), while a
    # watcher cancels this task if the client leaves before the answer starts: closing the
    # upstream request then makes vLLM abort the generation.
    task = asyncio.current_task()
    assert task is not None
    watcher = asyncio.ensure_future(_cancel_on_disconnect(request, task))
    try:
        return await _forward(gateway, forwarder, decision, path, raw, headers, trace, tap)
    except asyncio.CancelledError:
        if not watcher.done() or watcher.cancelled():
            raise  # cancelled from outside (shutdown), not by the client leaving
        task.uncancel()
        trace.finish(499, "client_closed")
        return Response(status_code=499)
    finally:
        watcher.cancel()


async def _forward(
    gateway: Gateway,
    forwarder: Forwarder,
    decision: RouteDecision,
    path: str,
    raw: bytes,
    headers: dict[str, str],
    trace: RequestTrace,
    tap: ResponseTap | None = None,
) -> Response:
    def count_failover(_backend: str, _why: str) -> None:
        gateway.stats.failovers += 1

    upstream = await forwarder.open(
        gateway.config.backends,
        gateway.registry.states,
        decision.backends,
        path=path,
        body=raw,
        headers=headers,
        trace=trace,
        on_failure=count_failover,
        tap=tap,
    )
    gateway.stats.by_backend[upstream.backend] += 1
    out_headers = upstream.headers | {
        "x-specgate-backend": upstream.backend,
        "x-specgate-rule": decision.rule,
        "x-specgate-task": decision.features.task,
        "x-request-id": trace.request_id,
    }
    try:
        if trace.stream:
            body_iter = await started(upstream.body)
            return StreamingResponse(body_iter, status_code=upstream.status, headers=out_headers)
        content = await read_all(upstream)
    except BaseException:
        await upstream.body.aclose()  # type: ignore[attr-defined]
        raise
    return Response(content, status_code=upstream.status, headers=out_headers)


async def started(body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Start ``body`` now (its first chunk is awaited here) and return an iterator that
    yields that chunk then the rest.

    A started async generator is closed by the event loop when dropped, so a client that
    leaves before the response starts still closes the upstream (an unstarted one would
    never run its ``finally``).
    """
    try:
        first = await anext(body)
    except StopAsyncIteration:
        first = b""

    async def chain() -> AsyncIterator[bytes]:
        try:
            if first:
                yield first
            async for chunk in body:
                yield chunk
        finally:
            await body.aclose()  # type: ignore[attr-defined]

    return chain()


async def _cancel_on_disconnect(request: Request, task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` when the client goes away (its body was already read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    task.cancel()


@router.post("/v1/completions", response_model=None, openapi_extra=openapi_body(CompletionFields))
async def completions(
    request: Request, gateway: GatewayDep, forwarder: ForwarderDep, settings: SettingsDep
) -> Response:
    """OpenAI completions, routed to one backend; JSON or SSE as the client asked."""
    return await _proxy(request, gateway, forwarder, settings, CompletionFields, "/v1/completions")


@router.post(
    "/v1/chat/completions", response_model=None, openapi_extra=openapi_body(ChatCompletionFields)
)
async def chat_completions(
    request: Request, gateway: GatewayDep, forwarder: ForwarderDep, settings: SettingsDep
) -> Response:
    """OpenAI chat completions, routed to one backend; JSON or SSE as the client asked."""
    return await _proxy(
        request, gateway, forwarder, settings, ChatCompletionFields, "/v1/chat/completions"
    )


@router.get("/v1/models")
async def models(gateway: GatewayDep) -> dict[str, Any]:
    """The models the gateway serves, in OpenAI's list format."""
    created = int(gateway.started_at)
    data = [
        {"id": name, "object": "model", "created": created, "owned_by": "specgate"}
        for name in gateway.served_models()
    ]
    return {"object": "list", "data": data}
