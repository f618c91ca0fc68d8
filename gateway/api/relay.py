"""Send a backend's answer to the client over ASGI, and cancel it when the client leaves.

The HTTP half of a request: the answer was opened by the pipeline
(:func:`gateway.pipeline.open_routed`, or the forwarder for relayed paths); here its
status, headers and bytes go out with raw ASGI ``send`` (no Starlette response objects on
the hot path), a stream chunk by chunk, while :func:`until_disconnect` watches the client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from gateway.upstream.answer import Upstream, read_all

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]
Receive = Callable[[], Awaitable[Message]]


async def send_answer(
    upstream: Upstream, headers: list[tuple[bytes, bytes]], send: Send, *, stream: bool
) -> None:
    """Send ``upstream``'s answer with ``headers`` (ASGI byte pairs): a stream as it arrives
    (what was read already, ``head``, then chunk by chunk), else read whole and sent with its
    ``content-length`` (a backend failing part-way is then a 502 before any byte,
    :func:`~gateway.upstream.forward.read_all`)."""
    if stream:
        await send({"type": "http.response.start", "status": upstream.status, "headers": headers})
        if upstream.head:
            await send({"type": "http.response.body", "body": upstream.head, "more_body": True})
        async for chunk in upstream.body:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
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
