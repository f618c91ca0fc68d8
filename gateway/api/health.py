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
    """200 when at least one backend passed its last health probe, else 503 (OpenAI envelope)."""
    healthy = [n for n, s in gateway.registry.states.items() if s.healthy]
    if not healthy:
        err = no_backend("No backend is healthy.")
        return JSONResponse(err.envelope(), status_code=503, headers=err.headers)
    return JSONResponse({"status": "ready", "healthy_backends": healthy})
