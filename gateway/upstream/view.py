"""One read model of a backend: what ``/routes``, ``/status``, ``/metrics`` and ``/ready``
show of its config and live state, taken at one instant.

Every reader formats a :class:`BackendView` instead of reading
:class:`~gateway.upstream.state.BackendState` fields itself, so health (see
:data:`~gateway.upstream.state.Health`) and the circuit breaker's verdict are computed in
one place and read the same everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from contracts.acceptance import AcceptanceStats, AcceptanceWindow
from contracts.config import BackendConfig
from gateway.upstream.circuit import CircuitBreaker, CircuitState
from gateway.upstream.state import BackendRegistry, DecisionStats, Health


@dataclass(frozen=True, slots=True)
class BackendView:
    """One backend's config and live state at one instant (``requests``: the requests it
    served since start). ``available``: health lets it take traffic (up or unknown).
    ``running``/``waiting``: its last ``/metrics`` scrape as read; ``other_clients``: the
    requests there not this gateway's expected now (scraped, aged:
    :meth:`~gateway.upstream.state.BackendState.foreign_load`; routing counts it rounded to
    the request); ``request_duration_s``: the
    mean time this gateway's answered requests held it (0: none yet), by which they age."""

    name: str
    config: BackendConfig
    health: Health
    last_error: str | None
    last_scrape: float | None
    circuit: CircuitState
    circuit_open: bool
    breaker: CircuitBreaker
    inflight: int
    running: float
    waiting: float
    other_clients: float
    request_duration_s: float
    kv_cache_usage: float
    acceptance: AcceptanceStats | None
    window: AcceptanceWindow
    demoted: bool
    demotions: int
    suspect: str | None
    sample_suspect: str | None
    requests: int

    @property
    def available(self) -> bool:
        """Health lets it take traffic: ``up`` or ``unknown`` (as routing reads it)."""
        return self.health != "down"


def backend_views(
    backends: Mapping[str, BackendConfig], registry: BackendRegistry, stats: DecisionStats
) -> list[BackendView]:
    """The views of ``backends`` (config order) that have a live state in ``registry``."""
    now = registry.clock()
    views = []
    for name, config in backends.items():
        state = registry.states.get(name)
        if state is None:
            continue
        views.append(
            BackendView(
                name=name,
                config=config,
                health=state.health,
                last_error=state.last_error,
                last_scrape=state.last_scrape,
                circuit=state.circuit.state(now),
                circuit_open=not state.circuit.routable(now),
                breaker=state.circuit,
                inflight=state.inflight,
                running=state.running,
                waiting=state.waiting,
                other_clients=round(state.foreign_load(now), 2),
                request_duration_s=round(state.duration_s, 6),
                kv_cache_usage=state.kv_cache_usage,
                acceptance=state.acceptance,
                window=state.window,
                demoted=state.demoted,
                demotions=state.demotions,
                suspect=state.suspect,
                sample_suspect=state.sample_suspect,
                requests=stats.by_backend[name],
            )
        )
    return views
