"""Wire the gateway's observability into an app's runtime: metrics, access log, history."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.service import Gateway
from gateway.settings import Settings
from gateway.telemetry.access_log import AccessLog
from gateway.telemetry.containment_metrics import ContainmentCollector
from gateway.telemetry.history import AcceptanceHistory
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.status import StatusPage
from gateway.upstream.deaths import DeathWatch

if TYPE_CHECKING:
    from gateway.background import BackgroundTasks


@dataclass(frozen=True, slots=True)
class Observability:
    """The app's own metrics registry, the acceptance history and the status page."""

    metrics: GatewayMetrics
    history: AcceptanceHistory
    status_page: StatusPage


@contextlib.contextmanager
def observability(
    gateway: Gateway,
    settings: Settings,
    deaths: DeathWatch,
    processes: Callable[[], dict[str, Any]] | None,
    tasks: BackgroundTasks,
) -> Iterator[Observability]:
    """Register the metrics and access-log observers on ``gateway`` while the block runs,
    and sample the acceptance history every health interval (a task of ``tasks``)."""
    metrics = GatewayMetrics(gateway)
    metrics.registry.register(ContainmentCollector(deaths, processes))
    access = AccessLog(settings.log_format)
    observers = [metrics.observe, access.observe]
    gateway.observers.extend(observers)
    history = AcceptanceHistory(
        gateway.registry, span_s=settings.status_history_s, interval_s=settings.health_interval_s
    )
    tasks.every(history.interval_s, history.sample, "specgate-history", first_s=0.0)
    try:
        yield Observability(
            metrics, history, StatusPage(refresh_s=max(2.0, settings.health_interval_s))
        )
    finally:
        gateway.observers[:] = [o for o in gateway.observers if o not in observers]
