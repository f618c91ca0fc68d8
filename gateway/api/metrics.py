"""``GET /metrics``: the gateway's own Prometheus metrics (``specgate_*``)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from gateway.runtime import runtime_of

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    """Prometheus text exposition (format 0.0.4, which every scraper reads) of the app's
    private registry: request counters and latency histograms, and per-backend gauges read
    from the live state at scrape time."""
    body = generate_latest(runtime_of(request.app).metrics.registry)
    return Response(body, media_type=CONTENT_TYPE_PLAIN_0_0_4)
