"""A backend's answer once its status and headers are settled, as the forwarder hands it on.

Kept apart from the forwarder (:mod:`gateway.upstream.forward`) so that what relays an
answer to the client needs only this value, not the failover machinery that produced it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass


@dataclass(slots=True)
class Upstream:
    """An open backend response whose status and headers are settled.

    ``headers`` are ASGI byte pairs (lower-case names). ``body`` yields the raw bytes (after
    ``head``, when a peek read some) and
    closes the response (and the in-flight count) when it ends, fails, or is closed early
    because the client left; for a JSON answer a failure part-way raises
    :class:`~gateway.failures.AnswerBroken`, a stream ends with an SSE error event.
    """

    backend: str
    status: int
    headers: list[tuple[bytes, bytes]]
    body: AsyncGenerator[bytes, None]
    attempts: int
    #: Bytes already read from ``body`` (an answer peeked at, :mod:`gateway.upstream.peek`),
    #: to be sent before the rest of it.
    head: bytes = b""

    async def aclose(self) -> None:
        """Close the response and end the backend lease (idempotent: a body already ended
        or closed does nothing)."""
        await self.body.aclose()

    async def __aenter__(self) -> Upstream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Leaving ``async with`` closes the answer (:meth:`aclose`) however it is left."""
        await self.aclose()


def is_event_stream_type(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether ``headers`` (ASGI byte pairs, lower-case names) give the ``Content-Type``
    ``text/event-stream`` (an answer relayed as it arrives, whatever the request asked)."""
    for name, value in headers:
        if name == b"content-type":
            return value.split(b";")[0].strip().lower() == b"text/event-stream"
    return False


async def read_all(upstream: Upstream) -> bytes:
    """Read a non-streamed answer whole; raises :class:`~gateway.failures.AnswerBroken` (or
    :class:`~gateway.failures.BackendDied`) when the backend fails part-way."""
    return upstream.head + b"".join([chunk async for chunk in upstream.body])
