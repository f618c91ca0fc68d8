"""Send a request to the decided backends, failing over before the first byte, and relay.

The upstream status and headers are settled before anything is sent to the client: a
connect error, a reset before the response, or a 502/503 moves on to the next backend of the
decision. After that the answer is relayed as raw bytes (SSE chunk by chunk for streams),
never re-parsed, and the upstream response is closed in a ``finally`` inside the body
iterator, so a client that goes away closes the upstream connection and vLLM aborts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass

from gateway.config import BackendConfig
from gateway.errors import GatewayError, no_backend, sse_error_event, upstream_timeout
from gateway.trace import RequestTrace
from gateway.upstream.client import (
    UpstreamBroken,
    UpstreamClient,
    UpstreamResponse,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from gateway.upstream.feedback import ResponseTap
from gateway.upstream.state import BackendState

logger = logging.getLogger(__name__)

#: RFC 9110 section 7.6.1 hop-by-hop headers, plus those the gateway sets itself.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "proxy-connection",
    }
)
_NOT_FORWARDED = HOP_BY_HOP | {"host", "content-length", "authorization", "cookie", "x-task-type"}
_NOT_RETURNED = HOP_BY_HOP | {"content-length", "date", "server"}
#: Statuses that mean "this backend cannot serve now": try the next one (as is any status
#: outside 200-599, which no OpenAI-compatible answer has: a 1xx upgrade, a 999).
RETRYABLE_STATUS = frozenset({502, 503})


def upstream_headers(client_headers: Mapping[str, str], backend: BackendConfig) -> dict[str, str]:
    """Headers sent to a backend: the client's, minus hop-by-hop and credentials, plus the
    backend's own key (``Authorization: Bearer``) when the config gives one."""
    out = {k: v for k, v in client_headers.items() if k.lower() not in _NOT_FORWARDED}
    if backend.api_key:
        out["authorization"] = f"Bearer {backend.api_key}"
    return out


def client_headers(raw: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Headers returned to the client from a backend's response (ASGI form: lower-case byte
    pairs), minus hop-by-hop ones."""
    return [(k, v) for k, v in raw if k.decode("latin-1") not in _NOT_RETURNED]


@dataclass(slots=True)
class Upstream:
    """An open backend response whose status and headers are settled.

    ``headers`` are ASGI byte pairs (lower-case names). ``body`` yields the raw bytes and
    closes the response (and the in-flight count) when it ends, fails, or is closed early
    because the client left; for a JSON answer a failure part-way raises
    :class:`~gateway.upstream.client.UpstreamBroken`, a stream ends with an SSE error event.
    """

    backend: str
    status: int
    headers: list[tuple[bytes, bytes]]
    body: AsyncGenerator[bytes, None]
    attempts: int


async def _relay(
    response: UpstreamResponse,
    state: BackendState,
    trace: RequestTrace,
    tap: ResponseTap | None = None,
) -> AsyncGenerator[bytes, None]:
    status, error = response.status, None
    try:
        yield b""  # primed by Forwarder.open: from here aclose() always runs the finally
        async for chunk in response.chunks():
            if tap is not None and not (chunk := tap.feed(chunk)):
                continue
            trace.on_chunk(chunk)
            yield chunk
        if tap is not None and (rest := tap.close()):
            trace.on_chunk(rest)
            yield rest
    except UpstreamBroken as exc:  # reset, or a gap longer than its timeout
        logger.warning("backend %s failed mid-response: %s", trace.backend, exc)
        status, error = 502, "upstream_error"
        if not trace.stream:
            raise
        if tap is not None and (rest := tap.close()):
            yield rest  # lines held back for the usage chunk that never came
        yield sse_error_event("The backend failed while streaming the response.")
    except BaseException:  # the client went away (cancelled) or the app is shutting down
        status, error = 499, "client_closed"
        raise
    finally:
        state.inflight -= 1
        await response.aclose()
        trace.finish(status, error)


@dataclass(slots=True)
class Forwarder:
    """Sends requests upstream with failover, for one app.

    ``max_attempts`` bounds the backends tried per request; ``first_byte_timeout_s`` bounds
    the wait for response headers and for the first body chunk, ``idle_timeout_s`` (seconds)
    each later gap between body chunks. Each backend's circuit breaker hears of every outcome.
    """

    client: UpstreamClient
    max_attempts: int
    first_byte_timeout_s: float
    idle_timeout_s: float
    clock: Callable[[], float] = time.monotonic

    async def open(
        self,
        backends: Mapping[str, BackendConfig],
        states: Mapping[str, BackendState],
        order: tuple[str, ...],
        *,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        trace: RequestTrace,
        on_failure: Callable[[str, str], None] | None = None,
        tap: ResponseTap | None = None,
    ) -> Upstream:
        """Try ``order`` (at most ``max_attempts`` backends, one at a time) until one answers
        with a status in 200-599 other than 502/503. ``tap`` reads feedback from a 200 answer (see
        :mod:`gateway.upstream.feedback`).

        Returns the settled :class:`Upstream`; ``trace`` learns the backend and attempts and
        is finished when the body ends. Raises :class:`GatewayError` 503 when every tried
        backend failed before answering, 504 when the chosen backend sent no headers within
        ``first_byte_timeout_s`` (not retried: the request may be running there).
        """
        last_why = "no candidate backend"
        for attempt, name in enumerate(order[: self.max_attempts], start=1):
            backend, state = backends[name], states[name]
            trace.backend, trace.attempts = name, attempt
            state.inflight += 1
            state.circuit.on_attempt(self.clock())
            try:
                response = await self.client.post(
                    backend.base_url + path,
                    body,
                    upstream_headers(headers, backend),
                    first_byte_timeout_s=self.first_byte_timeout_s,
                    idle_timeout_s=self.idle_timeout_s,
                )
            except UpstreamTimeout:
                state.inflight -= 1
                state.circuit.on_failure(self.clock())
                raise upstream_timeout() from None
            except UpstreamUnreachable as exc:
                state.inflight -= 1
                state.circuit.on_failure(self.clock())
                last_why = f"{name}: {exc}"
                _report(on_failure, name, last_why)
                continue
            except BaseException:  # cancelled: the client left while we waited for headers
                state.inflight -= 1
                state.circuit.probing = False
                raise
            if response.status in RETRYABLE_STATUS or not 200 <= response.status <= 599:
                state.inflight -= 1
                state.circuit.on_failure(self.clock())
                await response.aclose()
                last_why = f"{name}: HTTP {response.status}"
                _report(on_failure, name, last_why)
                continue
            state.circuit.on_success()
            body = _relay(response, state, trace, tap if response.status == 200 else None)
            await anext(body)  # the primer: the relay now owns the response and the count
            return Upstream(
                backend=name,
                status=response.status,
                headers=client_headers(response.raw_headers),
                body=body,
                attempts=attempt,
            )
        logger.warning("no backend could serve the request (last: %s)", last_why)
        raise no_backend()


def _report(on_failure: Callable[[str, str], None] | None, name: str, why: str) -> None:
    logger.info("failing over from %s", why)
    if on_failure is not None:
        on_failure(name, why)


async def read_all(upstream: Upstream) -> bytes:
    """Read a non-streamed answer whole; a backend dying part-way becomes a 502."""
    try:
        return b"".join([chunk async for chunk in upstream.body])
    except UpstreamBroken:
        raise GatewayError(
            502,
            "The backend failed while sending its response.",
            type="server_error",
            code="upstream_error",
        ) from None
