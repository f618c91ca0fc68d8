"""``GET /status``: a self-refreshing HTML page over the live state (no build step, no JS)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from gateway.api.deps import GatewayDep

router = APIRouter(tags=["admin"])


@router.get("/status", response_class=HTMLResponse)
async def status(request: Request, gateway: GatewayDep) -> HTMLResponse:
    """Backends (health, circuit, load, acceptance with a chart of the last minutes),
    decisions per rule and task, and the tuning advisor's recommendations."""
    page = request.app.state.status_page
    html = page.render(gateway, request.app.state.history)
    return HTMLResponse(html, headers={"cache-control": "no-store"})
