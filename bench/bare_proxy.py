"""The cheapest proxy on specgate's own stack: the reference its hot path is measured against.

    python -m bench.bare_proxy --upstream http://127.0.0.1:9100 --port 9300 [--workers N]

A raw ASGI app under uvicorn (uvloop, httptools, access log off: as ``specgate serve``)
that reads the request body, parses it as JSON once, posts it to one upstream with one
``aiohttp`` session and sends the answer back (JSON whole, an SSE stream chunk by chunk).
No routing, no classifier, no metrics, no log line: what any Python gateway on this stack
pays per request before doing anything of its own. ``bench.cost_check`` and
``bench.overhead`` state specgate's CPU per request as a multiple of this one's, measured
in the same run, so a busy machine moves both. ``--workers N`` (uvicorn's worker processes
on one listening socket, the kernel handing each new connection to one of them) takes
requests in N processes: what a relay that is not one event loop costs in a burst
(docs/benchmarks.md section 7, "Tenth run").
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

import aiohttp

#: The upstream of the app each worker process builds (:func:`from_env`).
UPSTREAM_ENV = "SPECGATE_BARE_PROXY_UPSTREAM"

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class BareProxy:
    """The ASGI app: ``/health`` answers 200, every other request is relayed to
    ``upstream`` (its path kept) and answered with the upstream's status and body."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["path"] == "/health":
            await _answer(send, 200, b"ok")
        else:
            await self._relay(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.session = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=0), auto_decompress=False
                )
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.session is not None:
                    await self.session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _relay(self, scope: Message, receive: Receive, send: Send) -> None:
        assert self.session is not None, "lifespan not started"
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        json.loads(body)  # a gateway reads the request once
        headers = {"content-type": "application/json"}
        url = self.upstream + scope["path"]
        async with self.session.post(url, data=body, headers=headers) as response:
            if response.content_type != "text/event-stream":
                await _answer(send, response.status, await response.read())
                return
            head = [(b"content-type", b"text/event-stream")]
            await send({"type": "http.response.start", "status": response.status, "headers": head})
            async for chunk in response.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})


async def _answer(send: Send, status: int, content: bytes) -> None:
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(content)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": content})


def from_env() -> BareProxy:
    """The app of one worker process: :class:`BareProxy` in front of the upstream named by
    :data:`UPSTREAM_ENV` (uvicorn's factory, called in each worker; KeyError when unset)."""
    return BareProxy(os.environ[UPSTREAM_ENV])


def main(argv: Sequence[str] | None = None) -> None:
    """Serve :class:`BareProxy` on 127.0.0.1 until interrupted, in ``--workers`` processes."""
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)
    os.environ[UPSTREAM_ENV] = args.upstream
    uvicorn.run(
        "bench.bare_proxy:from_env" if args.workers > 1 else BareProxy(args.upstream),
        factory=args.workers > 1,
        workers=args.workers,
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
        loop="uvloop",
        http="httptools",
    )


if __name__ == "__main__":
    main()
