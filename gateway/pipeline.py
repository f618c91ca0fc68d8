"""The open stage of a routed request: from its decision to the answer the client gets.

The forwarder opens the decided backends in order with failover before the first byte
(:class:`~gateway.upstream.forward.Forwarder`, a backend lease per attempt),
:class:`~gateway.settle.Settle` judges the first answer (a speculation refusal is routed
again, a Responses id remembered), and the decision counters are written here (serving
backend, failovers, last resort). What is left to the HTTP layer is sending the answer.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

from gateway.routing.control import served
from gateway.routing.policy import RouteDecision
from gateway.service import Gateway
from gateway.settle import Settle
from gateway.trace import RequestTrace
from gateway.upstream.answer import Upstream
from gateway.upstream.feedback import ResponseTap
from gateway.upstream.forward import Forwarder

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


@contextlib.asynccontextmanager
async def open_routed(
    gateway: Gateway,
    forwarder: Forwarder,
    decision: RouteDecision,
    request: tuple[str, bytes, Any, Mapping[str, str]],
    trace: RequestTrace,
    tap: ResponseTap | None,
    settle: Settle,
) -> AsyncIterator[tuple[Upstream, list[tuple[bytes, bytes]]]]:
    """Open ``decision``'s backends in order (failing over before the first byte), let
    ``settle`` judge the first answer (a refusal it retries elsewhere), and yield the answer
    with the response headers to send (ASGI byte pairs): the backend's, except the gateway's
    own ``x-specgate-*`` and ``x-request-id``, which are set here
    (``x-specgate-last-resort`` only when a backend outside the rule's pools answers: why
    the rule's pools did not). ``request``: path, body bytes as sent upstream, the parsed
    body and the headers. Raises :class:`~gateway.failures.UpstreamFailure` when no
    backend answers (from the forwarder); every answer is closed on the way out."""
    path, raw, body, headers = request

    def count_failover(_backend: str, _why: str) -> None:
        gateway.stats.failovers += 1

    async def open_on(order: tuple[str, ...], tap: ResponseTap | None) -> Upstream:
        return await forwarder.open(
            gateway.config.backends,
            gateway.registry.states,
            order,
            path=path,
            body=raw,
            headers=headers,
            trace=trace,
            on_failure=count_failover,
            tap=tap,
            request=body,
        )

    async with contextlib.AsyncExitStack() as answers:  # each answer closed on every way out
        first = await answers.enter_async_context(await open_on(decision.backends, tap))
        upstream = await answers.enter_async_context(await settle.settle(first, open_on))
        yield upstream, answer_headers(gateway, decision, upstream, trace.request_id)


def answer_headers(
    gateway: Gateway, decision: RouteDecision, upstream: Upstream, request_id: str
) -> list[tuple[bytes, bytes]]:
    """The response headers of ``upstream``'s answer to a request routed by ``decision``
    (see :func:`open_routed`); counts the serving backend and a last-resort answer."""
    gateway.stats.by_backend[upstream.backend] += 1
    out = [(k, v) for k, v in upstream.headers if k not in OWN_HEADERS]
    out += [
        (b"x-specgate-backend", upstream.backend.encode()),
        (b"x-specgate-rule", decision.rule.encode()),
        (b"x-specgate-task", decision.features.task.encode()),
        (b"x-request-id", request_id.encode()),
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
    return out


def header_value(text: str) -> bytes:
    """``text`` as a safe header value: ASCII (others backslash-escaped), no control
    characters (a config's names cannot split or corrupt the response head)."""
    raw = text.encode("ascii", "backslashreplace")
    return bytes(c for c in raw if 32 <= c < 127)
