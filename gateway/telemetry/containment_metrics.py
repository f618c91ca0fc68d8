"""Prometheus families of containment (deaths linked to requests, see
:mod:`gateway.upstream.deaths`, and the quarantine's counts) and of supervision (restarts and
process liveness, only under ``specgate up``), read at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.upstream.deaths import DeathWatch


class ContainmentCollector(Collector):
    """The families above from ``watch`` and ``processes`` (the supervisor's per-backend
    view, None when the gateway does not supervise its backends)."""

    def __init__(
        self, watch: DeathWatch, processes: Callable[[], dict[str, Any]] | None = None
    ) -> None:
        self.watch, self.processes = watch, processes

    def collect(self) -> Iterator[Metric]:
        """One sample per backend with a death or a supervised process, plus the counts."""
        deaths = CounterMetricFamily(
            "specgate_backend_deaths",
            "Backend deaths with requests in flight (engine dead, connection dropped, process "
            "gone), as the gateway saw them.",
            labels=("backend",),
        )
        for name, count in self.watch.deaths.items():
            deaths.add_metric([name], count)
        quarantined, suspects = self.watch.table.counts()
        yield deaths
        yield GaugeMetricFamily(
            "specgate_quarantined_requests",
            "Request fingerprints refused now (in flight at a backend death).",
            value=quarantined,
        )
        yield GaugeMetricFamily(
            "specgate_quarantine_suspects",
            "Request fingerprints in flight at one death among several requests.",
            value=suspects,
        )
        yield CounterMetricFamily(
            "specgate_quarantine_refused",
            "Requests answered 422 request_quarantined.",
            value=self.watch.table.refused,
        )
        if self.processes is None:
            return
        restarts = CounterMetricFamily(
            "specgate_backend_restarts",
            "Restarts of a local backend's server by the supervisor.",
            labels=("backend",),
        )
        up = GaugeMetricFamily(
            "specgate_backend_process_up",
            "1 while the local backend's server process runs.",
            labels=("backend",),
        )
        for name, view in self.processes().items():
            restarts.add_metric([name], view["restarts"])
            up.add_metric([name], 1.0 if view["running"] else 0.0)
        yield restarts
        yield up
