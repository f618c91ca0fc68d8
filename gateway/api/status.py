"""``GET /status``: a self-refreshing HTML page over the live state (no build step, no JS)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from gateway.api.deps import GatewayDep

router = APIRouter(tags=["admin"])


@router.get("/status", response_class=HTMLResponse)
async def status(request: Request, gateway: GatewayDep) -> HTMLResponse:
    """Backends (health, circuit, load, acceptance with a chart of the last minutes, process
    restarts and the last crash's log tail under ``specgate up``),
    decisions per rule and task, and the tuning advisor's recommendations."""
    page = request.app.state.status_page
    processes = request.app.state.processes
    html = page.render(gateway, request.app.state.history, processes() if processes else None)
    return HTMLResponse(html, headers={"cache-control": "no-store"})
