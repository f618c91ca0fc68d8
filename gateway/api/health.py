"""Liveness and readiness probes."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from gateway.api.deps import GatewayDep
from gateway.probe_port import readiness

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
    answer = readiness(gateway.backends())
    return JSONResponse(answer.body, status_code=answer.status, headers=answer.headers)
