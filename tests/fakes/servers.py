"""Real uvicorn servers on ephemeral 127.0.0.1 ports, run in a background thread."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running_server(
    app: Any, port: int | None = None, host: str = "127.0.0.1", **config: Any
) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a thread; yields its base URL; stops it on exit.

    ``host`` must be a loopback address; ``config`` goes to ``uvicorn.Config`` (e.g.
    ``timeout_graceful_shutdown``). Without a ``port`` the server gets a socket already
    bound to a free one, so no other process can take the port between choosing and
    binding it (two test runs on one machine did: "address already in use").
    """
    sockets = []
    if not port:
        sockets.append(socket.create_server((host, 0)))
        port = int(sockets[0].getsockname()[1])
    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on", **config)
    )
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": sockets or None}, name=f"uvicorn-{port}", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"server on port {port} did not start")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        for sock in sockets:
            sock.close()
