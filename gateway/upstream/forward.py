"""Send a request to the decided backends, failing over before the first byte, and relay.

The upstream status and headers are settled before anything is sent to the client: a
connect error, a reset before the response, or a 502/503 moves on to the next backend of the
decision, unless the backend died under the request and the death blames someone
(containment: see :mod:`gateway.upstream.deaths`): then the request is answered 500
``backend_died`` and not sent anywhere else, since it may be what killed the backend (a
death that blames nobody, a process killed from outside under load, moves the request on
once; a second death under it ends it the same way). A 5xx answer's first 64 KiB
are read before deciding (an engine-dead message confirms a death). A backend found down
(by the health poller, ``/health`` refused or not 200, not merely slow; or a death) while a
request waits for its headers is given up at once, as a dropped connection is, and the
request moves on. A non-streamed answer is read whole before anything is relayed (the
client would get nothing before its end anyway), so one that breaks off moves the request
on too, once per request, as a death that blames nobody does. After that the answer is
relayed as raw bytes (SSE chunk by chunk for streams), never re-parsed, and the upstream
response is closed in a ``finally`` inside the body iterator, so a client that goes away
closes the upstream connection and vLLM aborts. A stream whose client got any byte is never
sent elsewhere: it ends with an error event.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from contracts.config import BackendConfig
from gateway.failures import (
    AnswerBroken,
    BackendTimedOut,
    NoBackendAnswered,
    StreamFailureRenderer,
)
from gateway.trace import RequestTrace
from gateway.upstream.answer import Upstream, is_event_stream_type
from gateway.upstream.attempt import Attempt, MarkedDown
from gateway.upstream.client import (
    UpstreamBroken,
    UpstreamClient,
    UpstreamDropped,
    UpstreamResponse,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from gateway.upstream.deaths import DeathWatch, stream_error_message
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
#: RFC 9110 section 5.6.2: a header name.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
#: What must never reach an upstream request line or header.
_UNSAFE = re.compile(r"[\r\n\x00]")
#: Statuses that mean "this backend cannot serve now": try the next one (as is any status
#: outside 200-599, which no OpenAI-compatible answer has: a 1xx upgrade, a 999).
RETRYABLE_STATUS = frozenset({502, 503})


def upstream_headers(client_headers: Mapping[str, str], backend: BackendConfig) -> dict[str, str]:
    """Headers sent to a backend: the client's, minus hop-by-hop and credentials, plus the
    backend's own key (``Authorization: Bearer``) when the config gives one.

    Values are text as :func:`~gateway.auth.header_text` read them (UTF-8, else Latin-1) and
    are written back as UTF-8, so a UTF-8 value (``X-Title: Café``) reaches the backend
    byte for byte. A header whose name is not an RFC 9110 token or whose value holds CR, LF
    or NUL (no HTTP/1.1 parser lets one through; an in-process ASGI caller could) is
    dropped: it could split the upstream request."""
    out = {
        k: v
        for k, v in client_headers.items()
        if _forwarded(k) and (v.isprintable() or not _UNSAFE.search(v))  # cheap test first
    }
    if backend.api_key:
        out["authorization"] = f"Bearer {backend.api_key}"
    return out


@functools.lru_cache(maxsize=1024)
def _forwarded(name: str) -> bool:
    """Whether a client header named ``name`` goes to the backend (an RFC 9110 token, not
    hop-by-hop, not a credential); cached: clients send the same few names again and again."""
    return name.lower() not in _NOT_FORWARDED and _TOKEN.fullmatch(name) is not None


def client_headers(raw: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Headers returned to the client from a backend's response (ASGI form: lower-case byte
    pairs), minus hop-by-hop ones."""
    return [(k, v) for k, v in raw if k.decode("latin-1") not in _NOT_RETURNED]


#: Markers of a stream's terminal event: OpenAI's ``data: [DONE]``, Anthropic's
#: ``message_stop``, the Responses API's ``response.completed``/``.incomplete``/``.failed``.
#: A client that closes its connection once it has read one (the OpenAI SDK does, before
#: vLLM ends the HTTP stream) had its whole answer: the request counts as served, not 499.
STREAM_END = (
    b"data: [DONE]",
    b"event: message_stop",
    b"event: response.completed",
    b"event: response.incomplete",
    b"event: response.failed",
)


async def _relay(
    settled: _Settled,
    attempt: Attempt,
    trace: RequestTrace,
    tap: ResponseTap | None,
    render: StreamFailureRenderer,
    path: str,
    timed: bool = False,
) -> AsyncGenerator[bytes, None]:
    response, chunks, head = settled.response, settled.chunks, settled.head
    status, error = response.status, None
    prev = last = b""  # the stream's last two chunks: an error event there may mean a death
    state = attempt.state
    sent = b""  # the last chunk the client took (a terminal event there: it had it all)
    try:
        yield b""  # primed by Forwarder.open: from here aclose() always runs the finally
        # not given up when the backend is found down (the wait for headers is): a backend
        # gone resets the stream, a dead engine ends it with an error event, and a guard
        # around every chunk's wait cost ~1-2 us a chunk (review, session 22)
        async for chunk in _chain(head, chunks) if head else chunks:
            prev, last = last, chunk
            state.alive_at = time.monotonic()  # passive liveness (gateway.upstream.health)
            if tap is not None and not (chunk := tap.feed(chunk)):
                continue
            trace.on_chunk(chunk)
            yield chunk
            sent = chunk
        if tap is not None and (rest := tap.close()):
            trace.on_chunk(rest)
            yield rest
        if trace.stream and b'"error"' in (tail := prev + last):
            if (message := stream_error_message(tail)) is not None:
                timed = False  # an error event ended it early: not a whole answer's time
                await attempt.died("the stream ended with an error event", message)
    except UpstreamBroken as exc:  # reset, or a gap longer than its timeout
        logger.warning("backend %s failed mid-response: %s", trace.backend, exc)
        status, error = 502, "upstream_error"
        death = await attempt.died(f"the response broke off ({exc})")
        died = None if death is None or not death.participant else attempt.died_failure(death)
        if died is not None:
            status, error = 500, "backend_died"
        if not trace.stream:
            raise (died or AnswerBroken(str(exc))) from None
        if tap is not None and (rest := tap.close()):
            yield rest  # lines held back for the usage chunk that never came
        yield render(died, path)  # in the shape of the API of ``path``
    except BaseException:  # the client went away (cancelled) or the app is shutting down
        # a terminal event in the last chunk it took: it had the whole answer and left
        # before the backend closed the stream (looked for here, not in every chunk)
        if trace.stream and any(m in sent for m in STREAM_END):
            if tap is not None:
                tap.close()  # records the usage the tap saw
        else:
            status, error = 499, "client_closed"
        raise
    finally:
        # the backend lease; a whole 200 generation times the backend
        attempt.end(answered=timed and status == 200 and error is None)
        await response.aclose()
        trace.finish(status, error)


async def _chain(head: list[bytes], chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    for chunk in head:
        yield chunk
    async for chunk in chunks:
        yield chunk


@dataclass(slots=True)
class Forwarder:
    """Sends requests upstream with failover, for one app.

    ``max_attempts`` bounds the backends tried per request; ``first_byte_timeout_s`` bounds
    the wait for response headers and for the first body chunk, ``idle_timeout_s`` (seconds)
    each later gap between body chunks. Each backend's circuit breaker hears of every outcome.
    ``watch`` (None: no containment) registers attempts and judges backend deaths;
    ``stream_failure`` renders the events that end a stream failing part-way, for the
    request's path (:func:`gateway.errors.stream_failure_event`).
    """

    client: UpstreamClient
    max_attempts: int
    first_byte_timeout_s: float
    idle_timeout_s: float
    watch: DeathWatch | None = None
    clock: Callable[[], float] = time.monotonic
    stream_failure: StreamFailureRenderer = field(kw_only=True)

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
        request: Mapping[str, Any] | None = None,
        method: str = "POST",
        next_on: frozenset[int] = frozenset(),
        timed: bool = False,
    ) -> Upstream:
        """Try ``order`` (at most ``max_attempts`` backends, one at a time) until one answers
        with a status in 200-599 other than 502/503. ``tap`` reads feedback from a 200 answer (see
        :mod:`gateway.upstream.feedback`). ``method`` is the HTTP method (``path`` may carry a
        query string); ``next_on``: answers that also move on to the next backend, every one
        of ``order`` then being tried (the last one's answer is relayed: a stored Response's
        404 from the backends that do not hold it). ``timed``: a routed generation, whose
        whole 200 answer times the backend (how long requests hold it: a scrape of other
        clients' load ages by it, :meth:`~gateway.upstream.state.BackendState.foreign_load`;
        pass-through answers such as ``/tokenize`` come back in milliseconds and are not).

        Returns the settled :class:`Upstream`; ``trace`` learns the backend and attempts and
        is finished when the body ends. ``request`` (the parsed body) is what a death's
        fingerprint is computed from (None: the attempt is not watched). Raises
        :class:`~gateway.failures.NoBackendAnswered` when every tried backend failed
        before answering, :class:`~gateway.failures.BackendTimedOut` when the chosen
        backend sent no headers within ``first_byte_timeout_s`` (not retried: the request may
        be running there), :class:`~gateway.failures.BackendDied` when the backend
        died with this request in flight and the death blames someone, or it is the second
        death under the request this call (a first that blames nobody fails over),
        :class:`~gateway.failures.AnswerBroken` when a non-streamed answer broke off after
        the request had already moved on once (a first one fails over). A backend found
        down (not merely slow to probe) while the request waits for its headers, or for a
        non-streamed answer's end, is given up at once
        (:meth:`Attempt.given_up_when_down`): the request moves on.
        """
        last_why = "no candidate backend"
        tried = order if next_on else order[: self.max_attempts]
        survived = False  # a death that blamed nobody, once: the request moved on
        for number, name in enumerate(tried, start=1):
            backend, state = backends[name], states[name]
            trace.backend, trace.attempts = name, number
            attempt = Attempt(name, backend.base_url, state, self.watch, generation=timed)
            try:
                attempt.begin(path, request)  # the lease: ended on every way out of this try
                state.circuit.on_attempt(self.clock())
                sent = upstream_headers(headers, backend)
                outcome = await self._try(
                    attempt,
                    method,
                    backend.base_url + path,
                    body,
                    sent,
                    may_survive=not survived,
                    whole=not trace.stream,
                )
            except BaseException:
                if attempt.held:  # not settled as a failure: cancelled (the client left)
                    attempt.end()
                    state.circuit.probing = False
                raise
            if isinstance(outcome, str):
                last_why = outcome
                survived = survived or attempt.survived
                _report(on_failure, name, last_why)
                continue
            response = outcome.response
            if response.status in next_on and number < len(tried):
                attempt.end()
                await response.aclose()
                continue
            tapped = tap if response.status == 200 else None
            relay = _relay(outcome, attempt, trace, tapped, self.stream_failure, path, timed)
            await anext(relay)  # the primer: the relay now owns the response and the lease
            return Upstream(
                backend=name,
                status=response.status,
                headers=client_headers(response.raw_headers),
                body=relay,
                attempts=number,
            )
        logger.warning("no backend could serve the request (last: %s)", last_why)
        raise NoBackendAnswered(last_why)

    async def _try(
        self,
        attempt: Attempt,
        method: str,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        may_survive: bool,
        whole: bool,
    ) -> _Settled | str:
        """One attempt: its settled answer, or why it failed before answering (the lease
        then ended, the breaker told). Raises :class:`BackendTimedOut` on a first-byte
        timeout, :class:`BackendDied` when the backend died with this request in flight
        (unless the death blames nobody and ``may_survive``: :meth:`Attempt.contained`).
        The wait for the headers is given up when the backend is found down meanwhile
        (:meth:`Attempt.given_up_when_down`), as a connection dropped is. ``whole``: a
        non-streamed request (see :meth:`_judge`). An answer not settled (an error, or
        cancelled) is closed."""
        try:
            with attempt.given_up_when_down():
                response = await self.client.post(
                    url,
                    body,
                    headers,
                    method=method,
                    first_byte_timeout_s=self.first_byte_timeout_s,
                    idle_timeout_s=self.idle_timeout_s,
                )
        except UpstreamTimeout:
            self._failed(attempt)
            raise BackendTimedOut() from None
        except UpstreamUnreachable as exc:
            death = None
            if isinstance(exc, MarkedDown):  # it may have died under the request
                death = await attempt.died(f"{exc} before the response")
            elif isinstance(exc, UpstreamDropped):  # the request may have killed it
                death = await attempt.died(f"connection dropped before the response ({exc})")
            self._failed(attempt)
            if (died := attempt.contained(death, may_survive=may_survive)) is not None:
                raise died from None
            return f"{attempt.name}: {exc}"
        try:
            return await self._judge(attempt, response, may_survive=may_survive, whole=whole)
        except BaseException:
            await response.aclose()
            raise

    async def _judge(
        self, attempt: Attempt, response: UpstreamResponse, *, may_survive: bool, whole: bool
    ) -> _Settled | str:
        """Settle an answer's status: a 5xx is looked at closer (its head read: a death, or
        a retryable failure, closes it), a status outside 200-599 fails over. ``whole``
        (a non-streamed request): an answer that is not an event stream is read whole
        here, since the client gets nothing of it before its end anyway, so one that breaks
        off fails over (:meth:`_broke_off`)."""
        chunks, head = response.chunks(), list[bytes]()
        if 500 <= response.status <= 599:  # a dying backend answers so: look closer
            head, broken = await attempt.read_head(chunks)
            death = await attempt.died(f"HTTP {response.status}", b"".join(head))
            if death is not None or broken is not None or response.status in RETRYABLE_STATUS:
                self._failed(attempt)
                await response.aclose()
                if (died := attempt.contained(death, may_survive=may_survive)) is not None:
                    raise died
                return f"{attempt.name}: HTTP {response.status}"
        elif not 200 <= response.status <= 599:
            self._failed(attempt)
            await response.aclose()
            return f"{attempt.name}: HTTP {response.status}"
        if whole and not is_event_stream_type(response.raw_headers):
            rest, broken = await attempt.read_head(chunks, math.inf)
            if broken is not None:
                await response.aclose()
                return await self._broke_off(attempt, broken, may_survive=may_survive)
            head += rest
        attempt.state.circuit.on_success()
        attempt.state.alive_at = self.clock()  # it answers: alive (gateway.upstream.health)
        return _Settled(response, chunks, head)

    async def _broke_off(self, attempt: Attempt, why: str, *, may_survive: bool) -> str:
        """A non-streamed answer that broke off before its end (``why``), the client got
        nothing of it yet: why it failed, to fail over as a failure before the answer, once
        per request (``may_survive``: not yet; the attempt is then marked ``survived``), as
        a death that blames nobody does (:meth:`Attempt.contained`). Raises
        :class:`BackendDied` for a participant of a death that blames someone, or a second
        death; :class:`AnswerBroken` when the request already moved on once."""
        death = await attempt.died(f"the response broke off ({why})")
        self._failed(attempt)
        if (died := attempt.contained(death, may_survive=may_survive)) is not None:
            raise died
        if not may_survive:
            raise AnswerBroken(why)
        attempt.survived = True
        return f"{attempt.name}: the response broke off ({why})"

    def _failed(self, attempt: Attempt) -> None:
        """An attempt that failed before its answer was settled."""
        attempt.end()
        attempt.state.circuit.on_failure(self.clock())


@dataclass(slots=True)
class _Settled:
    """An answer whose status is settled: the response, its remaining chunks and the head
    already read from them (a 5xx relayed as is)."""

    response: UpstreamResponse
    chunks: AsyncIterator[bytes]
    head: list[bytes]


def _report(on_failure: Callable[[str, str], None] | None, name: str, why: str) -> None:
    logger.info("failing over from %s", why)
    if on_failure is not None:
        on_failure(name, why)
