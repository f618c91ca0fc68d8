"""A probe port that does not queue behind requests (``SPECGATE_HEALTH_PORT``, issue 26).

Under load the gateway's one event loop is busy with request work, and a ``/health`` on the
main port waits for its turn (docs/benchmarks.md, section 6: p99 329-455 ms at 400 concurrent
requests while a bare server answers in 7 ms). As a Kubernetes deployment uses a management
port, :func:`probe_port` serves ``GET /health`` and ``GET /ready`` from a daemon thread
(the standard library's :class:`http.server.ThreadingHTTPServer`), which needs only the GIL,
never a turn of the loop.

It does not lie: the loop publishes a :class:`Snapshot` every :data:`HEARTBEAT_S` (a
monotonic timestamp and the ``/ready`` answer, one immutable value swapped by one attribute
assignment); the thread answers ``/health`` 503 when that heartbeat is older than
``stale_after_s`` (the loop is stuck) and ``/ready`` from the snapshot. The thread never
touches asyncio objects. Importing this module does nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from gateway.background import BackgroundTasks
from gateway.errors import error_envelope, no_backend
from gateway.trace import request_id_of

logger = logging.getLogger(__name__)

#: Seconds between two heartbeats of the event loop (each also refreshes ``/ready``).
HEARTBEAT_S = 0.1


class ViewLike(Protocol):
    """What readiness reads of a backend's view (:class:`gateway.upstream.view.BackendView`)."""

    @property
    def name(self) -> str: ...
    @property
    def health(self) -> str: ...
    @property
    def available(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class Answer:
    """One probe answer: HTTP status, JSON body, extra headers."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


def readiness(views: Iterable[ViewLike]) -> Answer:
    """The ``/ready`` answer of both ports: 200 ``{"status": "ready", "healthy_backends",
    "unknown_backends"}`` when a backend can take traffic (``up``, or ``unknown``: not
    probed yet), else 503 ``no_healthy_backend`` in OpenAI's envelope."""
    views = list(views)
    if not any(view.available for view in views):
        err = no_backend("No backend is healthy.")
        return Answer(503, err.envelope(), err.headers)
    healthy = [view.name for view in views if view.health == "up"]
    unknown = [view.name for view in views if view.health == "unknown"]
    body = {"status": "ready", "healthy_backends": healthy, "unknown_backends": unknown}
    return Answer(200, body)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the loop last published: when (``time.monotonic()`` seconds) and ``/ready``."""

    beat: float
    ready: Answer


class ProbeServer(ThreadingHTTPServer):
    """The probe listener: ``GET /health`` (200 ``{"status": "ok"}`` while the heartbeat is
    younger than ``stale_after_s``, else 503 ``event_loop_stalled``), ``GET /ready`` (the
    snapshot's answer), 404 (OpenAI envelope) for anything else. ``clock`` is
    ``time.monotonic`` unless a test injects one; ``snapshot`` is replaced by the loop."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        snapshot: Snapshot,
        *,
        stale_after_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.snapshot = snapshot
        self.stale_after_s = stale_after_s
        self.clock = clock
        super().__init__(address, ProbeHandler)

    @property
    def port(self) -> int:
        """The port it listens on (the real one when 0 was asked)."""
        return int(self.server_address[1])

    def answer(self, method: str, path: str) -> Answer:
        """The answer to ``method path`` now (query string ignored)."""
        path = path.split("?", 1)[0]
        if method in ("GET", "HEAD") and path == "/health":
            age = self.clock() - self.snapshot.beat
            if age <= self.stale_after_s:
                return Answer(200, {"status": "ok"})
            message = f"The event loop has not run for {age:.1f} s."
            return Answer(503, error_envelope(message, "server_error", None, "event_loop_stalled"))
        if method in ("GET", "HEAD") and path == "/ready":
            return self.snapshot.ready
        return Answer(404, error_envelope("Not Found", "invalid_request_error", None, "404"))


class ProbeHandler(BaseHTTPRequestHandler):
    """One probe request on :class:`ProbeServer` (HTTP/1.0, one answer per connection)."""

    server: ProbeServer

    def _reply(self) -> None:
        """Send the server's answer; an error (4xx, 5xx) carries ``x-request-id`` (the
        client's, else a new one), as every error of the main port does."""
        answer = self.server.answer(self.command, self.path)
        body = json.dumps(answer.body).encode()
        headers = dict(answer.headers)
        if answer.status >= 400 and "x-request-id" not in headers:
            headers["x-request-id"] = request_id_of(self.headers.get("x-request-id"))
        self.send_response(answer.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = _reply

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib's name)
        """Quiet: probes every few seconds would flood the log."""


async def heartbeat(server: ProbeServer, ready: Callable[[], Answer]) -> None:
    """Publish a :class:`Snapshot` every :data:`HEARTBEAT_S` until cancelled (should
    ``ready`` fail, the last ``/ready`` answer is kept: the loop still runs)."""
    while True:
        try:
            answer = ready()
        except Exception:
            logger.exception("probe port: /ready could not be computed")
            answer = server.snapshot.ready
        server.snapshot = Snapshot(time.monotonic(), answer)
        await asyncio.sleep(HEARTBEAT_S)


@contextlib.asynccontextmanager
async def probe_port(
    host: str,
    port: int,
    ready: Callable[[], Answer],
    tasks: BackgroundTasks,
    *,
    stale_after_s: float,
) -> AsyncIterator[ProbeServer]:
    """Listen on ``host:port`` (raises :class:`OSError` when it cannot bind), serve from a
    daemon thread, start the heartbeat in ``tasks``; on exit stop the heartbeat, shut the
    server down and close its socket."""
    server = ProbeServer((host, port), Snapshot(time.monotonic(), ready()),
                         stale_after_s=stale_after_s)  # fmt: skip
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="specgate-probe-port",
        daemon=True,
    )  # fmt: skip
    thread.start()
    beat = tasks.start(heartbeat(server, ready), "specgate-heartbeat")
    logger.info("probe port: /health and /ready on %s:%d", host, server.port)
    try:
        yield server
    finally:
        beat.cancel()
        await asyncio.to_thread(server.shutdown)
        server.server_close()
        thread.join()
