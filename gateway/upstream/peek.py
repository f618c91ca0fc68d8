"""Look at the start of a settled backend answer before relaying it, then relay it whole.

Some decisions need the first bytes of an answer before the client sees anything: whether a
speculative backend refused the request (a 400, or a stream whose first event is an error),
or the id of a created Response. :func:`peek_event` reads a stream up to its first complete
SSE event (parsed by ``httpx-sse``, fed the relayed bytes through an ``httpx.Response``);
:func:`peek_body` reads a JSON answer whole. Both return the :class:`Upstream` with the bytes
read so far as its ``head``, sent before the rest, so nothing is lost or parsed twice and no
chunk passes a second generator. Only the requests that need it are peeked; the plain relay
never comes here.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import AsyncGenerator

import httpx
from httpx_sse import EventSource, ServerSentEvent, SSEError

from gateway.upstream.answer import Upstream, is_event_stream_type, read_all


def is_event_stream(upstream: Upstream) -> bool:
    """True when the answer's ``Content-Type`` is ``text/event-stream``."""
    return is_event_stream_type(upstream.headers)


async def peek_event(
    upstream: Upstream, *, containing: bytes | None = None
) -> tuple[ServerSentEvent | None, Upstream]:
    """The stream's first SSE event (None when it ends, or fails, before one), and the
    upstream to relay in its place. Waits at most as long as the relay would for a first
    chunk (the forwarder's first-byte timeout; a backend failing there ends the stream
    with an error event, which is then the first event). ``containing``: the caller wants
    the event only when its bytes hold these; when the first chunk is a whole event with a
    ``data`` field (vLLM's first chunk is) and lacks them, it is not parsed: None."""
    head = upstream.head
    if containing is not None and not head:
        head = await anext(upstream.body, b"")
        if containing not in head and _whole_data_event(head):
            return None, dataclasses.replace(upstream, head=head)
    seen = [head] if head else []

    async def source() -> AsyncGenerator[bytes, None]:
        for chunk in tuple(seen):
            yield chunk
        while True:
            try:
                chunk = await anext(upstream.body)
            except StopAsyncIteration:
                return
            seen.append(chunk)
            yield chunk

    tee = source()
    response = httpx.Response(200, headers={"content-type": "text/event-stream"}, content=tee)
    events = EventSource(response).aiter_sse()
    try:
        event = await anext(events, None)
    except (SSEError, UnicodeDecodeError):
        event = None
    finally:
        await events.aclose()
        await tee.aclose()
    return event, dataclasses.replace(upstream, head=b"".join(seen))


#: Two line endings in a row: always the end of an SSE event, never part of one line ending
#: (``\n\r\n`` also is, and is left to the parser).
_EVENT_END = re.compile(rb"\n\n|\r\r|\r\n\r\n")


def _whole_data_event(chunk: bytes) -> bool:
    """Whether ``chunk`` begins with a whole SSE event that has a ``data`` field (so the
    parser's first event is that one: a block of comments alone would not be one)."""
    return chunk.startswith(b"data:") and _EVENT_END.search(chunk) is not None


async def peek_body(upstream: Upstream) -> tuple[bytes, Upstream]:
    """A non-streamed answer's whole body and the upstream to relay in its place; raises
    :class:`~gateway.failures.AnswerBroken` when the backend fails part-way."""
    content = await read_all(upstream)
    return content, dataclasses.replace(upstream, head=content)
