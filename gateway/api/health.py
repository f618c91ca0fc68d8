"""Liveness and readiness probes."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway.api.deps import GatewayDep, with_request_id
from gateway.probe_port import readiness

router = APIRouter(tags=["health"])


@router.get("/health")
async def health() -> dict[str, str]:
    """The gateway process is alive (says nothing about backends)."""
    return {"status": "ok"}


@router.get("/ready", response_model=None)
async def ready(request: Request, gateway: GatewayDep) -> JSONResponse:
    """200 when at least one backend's health lets it take traffic (``up``, or ``unknown``:
    not probed yet, routed as routing does), else 503 (OpenAI envelope, with
    ``x-request-id`` as the main port's other errors). Lists the backends by health."""
    answer = readiness(gateway.backends())
    headers = answer.headers if answer.status == 200 else with_request_id(request, answer.headers)
    return JSONResponse(answer.body, status_code=answer.status, headers=headers)
