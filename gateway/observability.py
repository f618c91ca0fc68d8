"""Wire the gateway's observability into an app's lifespan: metrics, access log, history."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI

from gateway.access_log import AccessLog
from gateway.containment_metrics import ContainmentCollector
from gateway.history import AcceptanceHistory
from gateway.metrics import GatewayMetrics
from gateway.service import Gateway
from gateway.settings import Settings
from gateway.status import StatusPage


@contextlib.asynccontextmanager
async def observability(app: FastAPI, gateway: Gateway, settings: Settings) -> AsyncIterator[None]:
    """Register the metrics and access-log observers on ``gateway``, put ``metrics``,
    ``history`` and ``status_page`` on ``app.state``, and sample the acceptance history every
    health interval until the block exits."""
    metrics = GatewayMetrics(gateway)
    processes = getattr(app.state, "processes", None)
    metrics.registry.register(ContainmentCollector(app.state.deaths, processes))
    access = AccessLog(settings.log_format)
    gateway.observers.extend([metrics.observe, access.observe])
    history = AcceptanceHistory(
        gateway.registry, span_s=settings.status_history_s, interval_s=settings.health_interval_s
    )
    app.state.metrics = metrics
    app.state.history = history
    app.state.status_page = StatusPage(refresh_s=max(2.0, settings.health_interval_s))
    task = asyncio.create_task(history.run(), name="specgate-history")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
