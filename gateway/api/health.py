"""Liveness and readiness probes.

``GET /health`` is answered by :func:`answer_liveness`, called by the app before any
middleware or routing (:class:`gateway.app.SpecgateApp`): a probe then costs a few
microseconds of the event loop, however busy FastAPI's stack is. The route below stays for
the OpenAPI schema and other methods.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from gateway.api.deps import GatewayDep
from gateway.errors import no_backend

router = APIRouter(tags=["health"])

#: ``GET /health``'s answer, as the route below gives it.
LIVENESS_BODY = b'{"status":"ok"}'
_LIVENESS_HEAD = {
    "type": "http.response.start",
    "status": 200,
    "headers": [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(LIVENESS_BODY)).encode()),
    ],
}


async def answer_liveness(send: Callable[[MutableMapping[str, Any]], Awaitable[None]]) -> None:
    """Send ``GET /health``'s 200 ``{"status":"ok"}`` over raw ASGI ``send``: the process
    and its event loop are alive (says nothing about backends; ``/ready`` does)."""
    await send(dict(_LIVENESS_HEAD))
    await send({"type": "http.response.body", "body": LIVENESS_BODY})


@router.get("/health")
async def health() -> dict[str, str]:
    """The gateway process is alive (says nothing about backends)."""
    return {"status": "ok"}


@router.get("/ready", response_model=None)
async def ready(gateway: GatewayDep) -> JSONResponse:
    """200 when at least one backend's health lets it take traffic (``up``, or ``unknown``:
    not probed yet, routed as routing does), else 503 (OpenAI envelope). Lists the backends
    by health."""
    views = gateway.backends()
    if not any(view.available for view in views):
        err = no_backend("No backend is healthy.")
        return JSONResponse(err.envelope(), status_code=503, headers=err.headers)
    healthy = [view.name for view in views if view.health == "up"]
    unknown = [view.name for view in views if view.health == "unknown"]
    return JSONResponse(
        {"status": "ready", "healthy_backends": healthy, "unknown_backends": unknown}
    )
