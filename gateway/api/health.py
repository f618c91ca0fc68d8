"""Liveness and readiness probes."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from gateway.api.deps import GatewayDep
from gateway.errors import no_backend

router = APIRouter(tags=["health"])


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
