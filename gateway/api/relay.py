"""Relay a routed request's answer: open the decided backends, settle, send over ASGI.

The second half of a routed request (:class:`~gateway.api.openai.ProxyEndpoint` parses and
decides): the forwarder opens the backends in the decision's order with failover before the
first byte (:class:`~gateway.upstream.forward.Forwarder`, a backend lease per attempt),
:class:`~gateway.api.settle.Settle` judges the first answer, and the body goes to the client
with raw ASGI ``send`` (no Starlette response objects on the hot path).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from gateway.api.settle import Settle
from gateway.routing.control import served
from gateway.routing.policy import RouteDecision
from gateway.service import Gateway
from gateway.trace import RequestTrace
from gateway.upstream.feedback import ResponseTap
from gateway.upstream.forward import Forwarder, Upstream, read_all

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]
Receive = Callable[[], Awaitable[Message]]

#: Response headers the gateway sets itself (a backend's own are dropped).
OWN_HEADERS = frozenset(
    {
        b"x-specgate-backend",
        b"x-specgate-rule",
        b"x-specgate-task",
        b"x-specgate-guarded",
        b"x-specgate-last-resort",
        b"x-specgate-speculation",
        b"x-request-id",
    }
)


async def relay(
    gateway: Gateway,
    forwarder: Forwarder,
    decision: RouteDecision,
    path: str,
    request: tuple[bytes, Any],
    headers: dict[str, str],
    trace: RequestTrace,
    tap: ResponseTap | None,
    send: Send,
    settle: Settle,
) -> None:
    """Open ``decision``'s backends in order (failing over before the first byte), let
    ``settle`` judge the first answer (a refusal it retries elsewhere), then relay the
    answer to the client with ``send``: SSE chunk by chunk as each arrives, JSON whole with
    its ``content-length``. The backend's headers pass except the gateway's own
    ``x-specgate-*`` and ``x-request-id``, which are set here (``x-specgate-last-resort``
    only when a backend outside the rule's pools answers: why the rule's pools did not).
    ``request`` is the body as the client sent it (bytes) and as parsed. Raises
    :class:`~gateway.errors.GatewayError` when no backend answers (from the forwarder); the
    upstream answer is closed on every exit."""

    def count_failover(_backend: str, _why: str) -> None:
        gateway.stats.failovers += 1

    async def open_on(order: tuple[str, ...], tap: ResponseTap | None) -> Upstream:
        return await forwarder.open(
            gateway.config.backends,
            gateway.registry.states,
            order,
            path=path,
            body=request[0],
            headers=headers,
            trace=trace,
            on_failure=count_failover,
            tap=tap,
            request=request[1],
        )

    async with contextlib.AsyncExitStack() as answers:  # each answer closed on every way out
        first = await answers.enter_async_context(await open_on(decision.backends, tap))
        upstream = await answers.enter_async_context(await settle.settle(first, open_on))
        gateway.stats.by_backend[upstream.backend] += 1
        out = [(k, v) for k, v in upstream.headers if k not in OWN_HEADERS]
        out += [
            (b"x-specgate-backend", upstream.backend.encode()),
            (b"x-specgate-rule", decision.rule.encode()),
            (b"x-specgate-task", decision.features.task.encode()),
            (b"x-request-id", trace.request_id.encode()),
        ]
        if decision.guarded:  # which backends a known engine bug kept this request from
            guarded = ", ".join(f"{b}={g}" for b, g in decision.guarded)
            out.append((b"x-specgate-guarded", guarded.encode()))
        if decision.speculation is not None:  # the effect of the client's control
            effect = served(gateway.config, decision.speculation, upstream.backend)
            out.append((b"x-specgate-speculation", header_value(effect)))
        if upstream.backend in decision.outside:  # why the rule's pools did not serve it
            gateway.stats.last_resort += 1
            why = decision.last_resort or "failover: the rule's backends did not answer"
            out.append((b"x-specgate-last-resort", header_value(why)))
        await send_answer(upstream, out, send, stream=trace.stream)


def header_value(text: str) -> bytes:
    """``text`` as a safe header value: ASCII (others backslash-escaped), no control
    characters (a config's names cannot split or corrupt the response head)."""
    raw = text.encode("ascii", "backslashreplace")
    return bytes(c for c in raw if 32 <= c < 127)


async def send_answer(
    upstream: Upstream, headers: list[tuple[bytes, bytes]], send: Send, *, stream: bool
) -> None:
    """Send ``upstream``'s answer with ``headers`` (ASGI byte pairs): a stream chunk by chunk
    as each arrives, else read whole and sent with its ``content-length`` (a backend failing
    part-way is then a 502 before any byte, :func:`~gateway.upstream.forward.read_all`)."""
    if stream:
        await relay_stream(upstream, headers, send)
        return
    content = await read_all(upstream)
    headers = [*headers, (b"content-length", str(len(content)).encode())]
    await send({"type": "http.response.start", "status": upstream.status, "headers": headers})
    await send({"type": "http.response.body", "body": content})


async def until_disconnect(receive: Receive, work: Awaitable[None]) -> bool:
    """Run ``work`` in this task while a watcher cancels it if the client goes away (the
    request body already read): the upstream request is then closed, and vLLM aborts a
    request whose connection closes (its ``with_cancellation``). Inline rather than in a
    task of its own, so that a backend's in-flight count moves in the same step as the
    decision. Returns False when the client left (``work`` cancelled), True when ``work``
    ended; a cancellation from outside (shutdown) propagates."""
    task = asyncio.current_task()
    assert task is not None
    watcher = asyncio.ensure_future(_cancel_on_disconnect(receive, task))
    try:
        await work
    except asyncio.CancelledError:
        if not watcher.done() or watcher.cancelled():
            raise  # cancelled from outside (shutdown), not by the client leaving
        task.uncancel()
        return False
    finally:
        watcher.cancel()
    return True


async def _cancel_on_disconnect(receive: Receive, task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` when the client goes away."""
    while (await receive())["type"] != "http.disconnect":
        pass
    task.cancel()


async def relay_stream(upstream: Upstream, headers: list[tuple[bytes, bytes]], send: Send) -> None:
    """Send the status and headers, then each upstream chunk as it arrives."""
    await send({"type": "http.response.start", "status": upstream.status, "headers": headers})
    async for chunk in upstream.body:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})
