"""The routed generation endpoints (``/v1/completions``, ``/v1/chat/completions``,
``/v1/responses``, ``/v1/messages``) and ``/v1/models``.

Handlers only parse, route and relay: the body bytes the client sent are what the backend
receives; the response carries ``x-specgate-backend``, ``x-specgate-rule``,
``x-specgate-task``, ``x-request-id``, when a known-engine-bug guard took backends out,
``x-specgate-guarded`` (``backend=guard, ...``), and when the request carried
``X-Specgate-Speculation``, ``x-specgate-speculation`` with its effect
(:mod:`gateway.routing.control`).

The routed endpoints are the hot path and are served as raw ASGI apps
(:class:`ProxyEndpoint`): ``gateway.app.SpecgateApp`` hands them their ``POST`` requests
before Starlette's middleware stack, and :func:`proxy_routes` also mounts them as routes (so
other methods get a 405 envelope). No FastAPI dependency solving, no ``Request``/``Response``
objects, the body relayed with ASGI ``send`` (measured in docs/benchmarks.md). Their OpenAPI
operations come from :func:`proxy_openapi_paths`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from fastapi import APIRouter, Request
from starlette.routing import Route

from gateway.api.deps import GatewayDep
from gateway.api.relay import Send, send_answer, until_disconnect
from gateway.auth import check_client_key, header_text
from gateway.classify.protocol import (
    ChatCompletionFields,
    CompletionFields,
    MessagesFields,
    ResponsesFields,
    RoutedFields,
    openapi_body,
)
from gateway.errors import GatewayError, from_upstream, model_not_found
from gateway.failures import UpstreamFailure
from gateway.pipeline import RoutedRequest, open_routed, prepare_routed
from gateway.runtime import Runtime, runtime_of
from gateway.service import Gateway
from gateway.trace import request_id_of
from gateway.upstream.catalog import merge_cards

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Kind = type[RoutedFields]

logger = logging.getLogger(__name__)
router = APIRouter(tags=["openai"])

#: The routed endpoints: path, request fields, OpenAPI summary and description.
ENDPOINTS: tuple[tuple[str, Kind, str, str], ...] = (
    (
        "/v1/completions",
        CompletionFields,
        "Completions",
        "OpenAI completions, routed to one backend; JSON or SSE as the client asked.",
    ),
    (
        "/v1/chat/completions",
        ChatCompletionFields,
        "Chat Completions",
        "OpenAI chat completions, routed to one backend; JSON or SSE as the client asked.",
    ),
    (
        "/v1/responses",
        ResponsesFields,
        "Responses",
        "OpenAI Responses, routed to one backend (to the one holding `previous_response_id`"
        " when given); JSON or SSE as the client asked.",
    ),
    (
        "/v1/messages",
        MessagesFields,
        "Messages",
        "Anthropic Messages, routed to one backend; JSON or SSE as the client asked.",
    ),
)


class ClientGone(Exception):
    """The client disconnected while its request body was being read."""


async def read_body_within(
    receive: Receive, headers: Mapping[str, str], limit: int, timeout_s: float
) -> bytes:
    """:func:`read_body` within ``timeout_s`` seconds (:class:`GatewayError` 408 past it:
    a slow sender holds no slot for ever)."""
    try:
        async with asyncio.timeout(timeout_s):
            return await read_body(receive, headers, limit)
    except TimeoutError:
        raise GatewayError(
            408, f"The request body did not arrive within {timeout_s:g} s.", code="request_timeout"
        ) from None


async def read_body(receive: Receive, headers: Mapping[str, str], limit: int) -> bytes:
    """The request body, at most ``limit`` bytes; raises :class:`GatewayError` 413 past it
    and :class:`ClientGone` when the client disconnects first."""
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _too_large(limit: int) -> GatewayError:
    return GatewayError(
        413, f"The request body is larger than {limit} bytes.", code="request_too_large"
    )


class ProxyEndpoint:
    """The raw ASGI app of one routed endpoint (``POST`` only; the route checks the method).

    Per request: client key, header size (431), the gateway's in-flight cap (429), body
    (413, 400), routing decision (503/429 when no backend can take it), forwarding with
    failover (:class:`~gateway.upstream.forward.Forwarder`), then the backend's status,
    headers and bytes relayed (a stream chunk by chunk). Errors before the response starts
    are answered in OpenAI's envelope, Anthropic's on ``/v1/messages`` (an unexpected
    exception as a logged 500); a client
    that leaves cancels the upstream request. Reads the lifespan's objects from the app's
    :class:`~gateway.runtime.Runtime`.
    """

    def __init__(self, path: str, kind: Kind) -> None:
        self.path, self.kind = path, kind

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = runtime_of(scope["app"])
        # the first of repeated headers counts, as in Starlette's Request.headers
        headers = {header_text(k): header_text(v) for k, v in reversed(scope["headers"])}
        gateway: Gateway = state.gateway
        trace = gateway.new_trace(request_id_of(headers.get("x-request-id")), self.path)
        try:
            check_client_key(state.auth, headers.get("authorization"))
            request = RoutedRequest(self.kind, self.path, b"", headers, trace)
            await self._serve(scope, receive, send, state, request)
        except (GatewayError, UpstreamFailure) as exc:
            error = exc if isinstance(exc, GatewayError) else from_upstream(exc)
            trace.finish(error.status, error.code)
            await send_error(send, error, self.path, trace.request_id)
        except ClientGone:
            trace.finish(499, "client_closed")
        except asyncio.CancelledError:  # the app is shutting down
            trace.finish(499, "client_closed")
            raise
        except Exception:  # never expected
            trace.finish(500, "internal_error")
            logger.exception("unhandled error")
            internal = GatewayError(500, "Internal gateway error.", code="internal_error")
            with contextlib.suppress(RuntimeError):  # the response had already started
                await send_error(send, internal, self.path, trace.request_id)

    @staticmethod
    async def _serve(
        scope: Scope, receive: Receive, send: Send, state: Runtime, request: RoutedRequest
    ) -> None:
        """Header size, an early in-flight check, the body, then the stages (within an
        admission slot: counted once the body is in, so slow senders hold no slot)."""
        gateway, settings = state.gateway, state.settings
        if sum(len(k) + len(v) for k, v in scope["headers"]) > settings.max_header_bytes:
            raise GatewayError(431, "The request headers are too large.", code="headers_too_large")
        admission = gateway.admission(settings.max_inflight)
        admission.check()  # refused before reading the body
        request.raw = await read_body_within(
            receive, request.headers, settings.max_body_bytes, settings.body_timeout_s
        )
        with admission:
            await prepare_routed(state, request)
            work = send_routed(state, request, send)
            if not await until_disconnect(receive, work):
                request.trace.finish(499, "client_closed")


async def send_routed(state: Runtime, request: RoutedRequest, send: Send) -> None:
    """Open the prepared ``request`` (:func:`gateway.pipeline.open_routed`), send its answer
    with its headers, then close it."""
    upstream, headers = await open_routed(state, request)
    async with upstream:
        await send_answer(upstream, headers, send, stream=request.stream)


async def send_error(
    send: Send, error: GatewayError, path: str = "", request_id: str | None = None
) -> None:
    """Answer ``error`` to a client of ``path`` (JSON, its status and extra headers): in
    OpenAI's envelope, on Anthropic's Messages paths in Anthropic's
    (:meth:`~gateway.errors.GatewayError.body_for`); with ``request_id`` as
    ``x-request-id``, as a routed endpoint's relayed answers have it (the OpenAI SDK reads
    it into its errors' ``request_id``)."""
    content = json.dumps(error.body_for(path)).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(content)).encode()),
    ]
    if request_id is not None:
        headers.append((b"x-request-id", request_id.encode()))  # as a relayed answer's
    headers += [
        (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in error.headers.items()
    ]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": content})


def proxy_endpoints() -> dict[str, ProxyEndpoint]:
    """The routed endpoints' ASGI apps by path."""
    return {path: ProxyEndpoint(path, kind) for path, kind, *_ in ENDPOINTS}


def proxy_routes(endpoints: Mapping[str, ProxyEndpoint]) -> list[Route]:
    """Starlette routes for ``endpoints`` (``POST``; other methods get 405)."""
    return [Route(path, endpoint, methods=["POST"]) for path, endpoint in endpoints.items()]


def proxy_openapi_paths() -> dict[str, Any]:
    """OpenAPI path items of the routed endpoints, for the app's schema: the fields the
    gateway reads (any other OpenAI or vLLM field is allowed and forwarded untouched)."""
    paths = {}
    for path, kind, summary, description in ENDPOINTS:
        name = summary.lower().replace(" ", "_")
        operation = {
            "tags": ["openai"],
            "summary": summary,
            "description": description,
            "operationId": f"{name}_{path.strip('/').replace('/', '_')}_post",
            **openapi_body(kind),
            "responses": {
                "200": {
                    "description": "The backend's answer: JSON, or SSE when `stream` is true",
                    "content": {"application/json": {"schema": {}}},
                }
            },
        }
        paths[path] = {"post": operation}
    return paths


@router.get("/v1/models")
async def models(request: Request, gateway: GatewayDep) -> dict[str, Any]:
    """The models the gateway serves, in OpenAI's list format, each with its backends' own
    card (vLLM's ``root``, ``parent``, ``permission``, and the smallest ``max_model_len`` of
    the backends serving it; :func:`~gateway.upstream.catalog.merge_cards`)."""
    return {"object": "list", "data": await _model_cards(request, gateway)}


@router.get("/v1/models/{model:path}")
async def model_card(model: str, request: Request, gateway: GatewayDep) -> dict[str, Any]:
    """One served model's card, as in :func:`models`: OpenAI's ``GET /v1/models/{model}``,
    which the OpenAI SDK's ``models.retrieve`` calls (vLLM's server has no such route; a
    name may hold slashes, ``org/model``). Raises 404 ``model_not_found`` for a name no
    backend serves."""
    for card in await _model_cards(request, gateway):
        if card["id"] == model:
            return card
    raise model_not_found(model)


async def _model_cards(request: Request, gateway: Gateway) -> list[dict[str, Any]]:
    catalog = runtime_of(request.app).catalog
    await catalog.refresh(gateway.config.backends, gateway.registry.available())
    cards = {name: catalog.cards(name) for name in gateway.config.backends}
    return merge_cards(gateway.served_models(), cards, int(gateway.started_at))
