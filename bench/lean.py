"""A lean hot path, measured as an upper bound of what a rewrite of the proxy path could save.

:class:`LeanProxy` wraps the real app and serves ``POST /v1/completions`` and
``/v1/chat/completions`` itself as a raw ASGI handler, with aiohttp directly (no httpx layer):
the same body read, JSON parse, field validation, classifier, routing decision, in-flight
count and request trace (metrics and access-log observers) as specgate, but no FastAPI
routing or dependency injection, no per-request disconnect watcher and no ``httpx`` objects.

It is an experiment for ``python -m bench.variants --lean``: it tries only the first backend
of the decision and has none of specgate's failover, caps, auth or error envelopes, so it
must never serve traffic. Its figures show how much of specgate's CPU per request is
framework and client plumbing rather than routing.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import aiohttp

from gateway.protocol import ChatCompletionFields, CompletionFields, validate_fields
from gateway.upstream.forward import upstream_headers

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_KINDS = {"/v1/completions": CompletionFields, "/v1/chat/completions": ChatCompletionFields}
_DROPPED = {"connection", "keep-alive", "transfer-encoding", "content-length", "date", "server"}


class LeanProxy:
    """ASGI middleware taking over the two proxy endpoints of a specgate app."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = _KINDS.get(scope.get("path", ""))
        if scope["type"] != "http" or scope["method"] != "POST" or kind is None:
            await self.app(scope, receive, send)
            return
        if self.session is None:
            connector = aiohttp.TCPConnector(limit=512)
            self.session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        await self._proxy(scope, receive, send, kind)

    async def _proxy(self, scope: Scope, receive: Receive, send: Send, kind: Any) -> None:
        gateway = self.app.state.gateway
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        body = json.loads(raw)
        fields = validate_fields(kind, body)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        path = scope["path"]
        trace = gateway.new_trace(headers.get("x-request-id") or uuid.uuid4().hex, path)
        trace.stream = bool(fields.stream)
        features = gateway.features(body, fields.model, headers.get("x-task-type"))
        decision = gateway.decide(features)
        name = decision.backends[0]
        backend, state = gateway.config.backends[name], gateway.registry.states[name]
        trace.task, trace.rule, trace.backend, trace.attempts = (
            features.task,
            decision.rule,
            name,
            1,
        )
        state.inflight += 1
        status = 502
        assert self.session is not None
        try:
            async with self.session.post(
                backend.base_url + path, data=raw, headers=upstream_headers(headers, backend)
            ) as resp:
                status = resp.status
                out = [
                    (k.lower().encode(), v.encode())
                    for k, v in resp.headers.items()
                    if k.lower() not in _DROPPED
                ]
                out += [
                    (b"x-specgate-backend", name.encode()),
                    (b"x-specgate-rule", decision.rule.encode()),
                    (b"x-specgate-task", features.task.encode()),
                    (b"x-request-id", trace.request_id.encode()),
                ]
                if trace.stream:
                    await send({"type": "http.response.start", "status": status, "headers": out})
                    async for chunk in resp.content.iter_any():
                        trace.on_chunk(chunk)
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    await send({"type": "http.response.body", "body": b""})
                else:
                    data = await resp.read()
                    trace.on_chunk(data)
                    out.append((b"content-length", str(len(data)).encode()))
                    await send({"type": "http.response.start", "status": status, "headers": out})
                    await send({"type": "http.response.body", "body": data})
        finally:
            state.inflight -= 1
            trace.finish(status)
