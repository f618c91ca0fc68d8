"""An httpx transport that sends each backend URL to its own in-process ASGI app."""

from __future__ import annotations

import httpx


class BackendsTransport(httpx.AsyncBaseTransport):
    """Dispatch by ``host:port`` to an ASGI app; an unknown address refuses the connection
    (``httpx.ConnectError``), like a backend that is not running."""

    def __init__(self, apps: dict[str, object]) -> None:
        self.transports = {addr: httpx.ASGITransport(app=app) for addr, app in apps.items()}  # type: ignore[arg-type]
        #: transports set aside while their backends refuse (a test puts them back)
        self.refusing: dict[str, httpx.ASGITransport] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        transport = self.transports.get(request.url.netloc.decode())
        if transport is None:
            raise httpx.ConnectError("connection refused", request=request)
        return await transport.handle_async_request(request)
