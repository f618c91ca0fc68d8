"""peek_event: the first SSE event of a settled stream, every byte still relayed after it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from gateway.upstream.answer import Upstream, read_all
from gateway.upstream.peek import peek_event

ERROR = b'data: {"error": {"message": "speculative decoding does not support it"}}\n\n'
DELTA = b'data: {"choices": [{"delta": {"content": "Hi"}}]}\n\n'


def stream(*chunks: bytes) -> Upstream:
    async def body() -> AsyncGenerator[bytes, None]:
        for chunk in chunks:
            yield chunk

    headers = [(b"content-type", b"text/event-stream")]
    return Upstream(backend="ngram", status=200, headers=headers, body=body(), attempts=1)


def peek(upstream: Upstream, containing: bytes | None) -> tuple[str | None, bytes]:
    async def run() -> tuple[str | None, bytes]:
        event, replay = await peek_event(upstream, containing=containing)
        return (None if event is None else event.data), await read_all(replay)

    return asyncio.run(run())


def test_a_first_event_without_the_bytes_is_not_parsed_and_relayed_whole() -> None:
    assert peek(stream(DELTA, DELTA, b"data: [DONE]\n\n"), b"error") == (
        None,
        DELTA + DELTA + b"data: [DONE]\n\n",
    )
    # without `containing` the same event is parsed
    data, _ = peek(stream(DELTA), None)
    assert data == '{"choices": [{"delta": {"content": "Hi"}}]}'


def test_an_error_event_is_found_split_across_chunks_or_after_a_comment() -> None:
    expected = '{"error": {"message": "speculative decoding does not support it"}}'
    assert peek(stream(ERROR[:20], ERROR[20:]), b"error") == (expected, ERROR)
    # a comment block is no event: the first event is the error after it
    assert peek(stream(b": ping\n\n" + ERROR), b"error") == (expected, b": ping\n\n" + ERROR)
    assert peek(stream(b": ping\n\n", ERROR), b"error") == (expected, b": ping\n\n" + ERROR)


def test_an_empty_stream_has_no_event() -> None:
    assert peek(stream(), b"error") == (None, b"")
