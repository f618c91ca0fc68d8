"""``specgate serve`` with time marks per request, for :mod:`bench.wave_probe` (not the product).

    MARKS=marks.json python -m bench.wave_marks serve --config CONFIG [--port PORT]

Wraps the routed endpoint's stages (``gateway.api.openai``) and records, per request id (the
client's ``x-request-id``), ``time.monotonic()`` seconds at: ``entry`` (the endpoint's ASGI
call begins), ``prep0``/``prep1`` (the prepare stage: parse, classify, decide), ``open`` (the
backend's status and headers are in) and ``first`` (the first body chunk goes to the client).
``time.monotonic()`` is one clock for every process of a host, so the marks line up with the
probe client's own. Written to ``$MARKS`` as ``{id: {mark: seconds}}`` when the server exits
(SIGTERM, SIGINT). Costs a few dict writes per request; a run with it measures the gateway's
timeline, not its speed (docs/benchmarks.md section 7, "Seventh run (session 15)").
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import time
from typing import Any

import gateway.api.openai as endpoint

Marks = dict[str, dict[str, float]]


def instrument(marks: Marks) -> None:
    """Wrap the endpoint's stages so that each request's marks land in ``marks``."""
    call, prepare, open_routed, send_answer = (
        endpoint.ProxyEndpoint.__call__,
        endpoint.prepare_routed,
        endpoint.open_routed,
        endpoint.send_answer,
    )

    def mark(request_id: str, name: str) -> None:
        marks.setdefault(request_id, {})[name] = time.monotonic()

    async def marked_call(self: Any, scope: Any, receive: Any, send: Any) -> None:
        request_id = dict(scope["headers"]).get(b"x-request-id", b"").decode()
        mark(request_id, "entry")
        await call(self, scope, receive, send)

    async def marked_prepare(runtime: Any, request: Any) -> None:
        mark(request.trace.request_id, "prep0")
        await prepare(runtime, request)
        mark(request.trace.request_id, "prep1")

    async def marked_open(runtime: Any, request: Any) -> Any:
        opened = await open_routed(runtime, request)
        mark(request.trace.request_id, "open")
        return opened

    async def marked_answer(upstream: Any, headers: Any, send: Any, *, stream: bool) -> None:
        request_id = dict(headers).get(b"x-request-id", b"").decode()

        async def first_send(message: Any) -> None:
            if message["type"] == "http.response.body" and message.get("body"):
                if "first" not in marks.get(request_id, {}):
                    mark(request_id, "first")
            await send(message)

        await send_answer(upstream, headers, first_send, stream=stream)

    endpoint.ProxyEndpoint.__call__ = marked_call  # type: ignore[method-assign]
    endpoint.prepare_routed = marked_prepare
    endpoint.open_routed = marked_open
    endpoint.send_answer = marked_answer


def main() -> int:
    """Serve as ``specgate`` does (its arguments), marks written to ``$MARKS`` at exit."""
    from cli.main import main as specgate

    path, marks = os.environ["MARKS"], {}
    instrument(marks)
    atexit.register(lambda: json.dump(marks, open(path, "w")))
    # uvicorn (0.29+) re-raises the signal that stopped it once it has shut down; SIGTERM's
    # default action would then end the process without running the atexit above
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    return specgate(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
