"""``GET /status``: a self-refreshing HTML page over the live state (no build step, no JS)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from gateway.api.deps import RuntimeDep

router = APIRouter(tags=["admin"])


@router.get("/status", response_class=HTMLResponse)
async def status(runtime: RuntimeDep) -> HTMLResponse:
    """Backends (health, circuit, load, acceptance with a chart of the last minutes, process
    restarts and the last crash's log tail under ``specgate up``),
    decisions per rule and task, the distribution canary's verdicts, evidence and cost, and
    the tuning advisor's recommendations."""
    processes, canary = runtime.processes, runtime.sample_canary
    html = runtime.status_page.render(
        runtime.gateway,
        runtime.history,
        processes() if processes else None,
        None if canary is None else canary.to_json(),
    )
    return HTMLResponse(html, headers={"cache-control": "no-store"})
