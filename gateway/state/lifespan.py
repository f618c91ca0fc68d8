"""Wire the shared state into an app's runtime (an app-lifespan block) and expose it.

:func:`shared_state` yields a :class:`StateView` whatever the backend: for ``embedded`` (the
default) nothing is shared and the view only reports that; for ``redis`` it swaps the
gateway's learner for a :class:`~gateway.state.learning.SharedLearner` (keeping what was
loaded from the state file), syncs once before the app serves (bounded: a Redis that is down
delays the start by at most ``4 x state.timeout_s``), then every ``state.sync_interval_s``
in a background task, and closes the client on exit. The ``state`` block is read at start:
a reload that changes it logs a warning and keeps the running backend.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.background import BackgroundTasks
from gateway.service import Gateway
from gateway.settings import Settings
from gateway.state.affinity import AffinityMirror
from gateway.state.learning import SharedLearner
from gateway.state.quarantine import QuarantineMirror
from gateway.state.refusals import RefusalMirror
from gateway.state.sync import RedisState, Shared, redacted
from gateway.upstream.affinity import ResponseAffinity
from gateway.upstream.quarantine import QuarantineTable

logger = logging.getLogger(__name__)


class StateView:
    """What ``/routes`` (``state``) and ``/metrics`` show of the state backend; ``redis``
    is None for the embedded backend."""

    def __init__(self, redis: RedisState | None = None) -> None:
        self.redis = redis

    @property
    def up(self) -> bool:
        """Whether the state backend is reachable now (the embedded one always is)."""
        return self.redis is None or bool(self.redis.up)

    def to_json(self) -> dict[str, Any]:
        """``{"backend": "embedded", "up": true}`` or the Redis link's status."""
        if self.redis is None:
            return {"backend": "embedded", "up": True}
        return self.redis.to_json()


class StateCollector(Collector):
    """``specgate_state_backend_up`` and, for Redis, its failed syncs and live peers."""

    def __init__(self, view: StateView) -> None:
        self.view = view

    def collect(self) -> Iterator[Metric]:
        """The state backend's families now."""
        backend = "embedded" if self.view.redis is None else "redis"
        up = GaugeMetricFamily(
            "specgate_state_backend_up",
            "1 when the state backend is reachable (always for embedded); 0 while this "
            "replica serves on its local state because Redis is not.",
            labels=("backend",),
        )
        up.add_metric([backend], 1.0 if self.view.up else 0.0)
        yield up
        if self.view.redis is None:
            return
        yield CounterMetricFamily(
            "specgate_state_sync_failures",
            "Syncs with Redis that failed (connection, timeout or error).",
            value=self.view.redis.failures,
        )
        yield GaugeMetricFamily(
            "specgate_state_peers",
            "Other replicas whose adaptive state this replica merged at its last sync.",
            value=len(self.view.redis.peers),
        )


def redis_client(url: str, timeout_s: float) -> Redis:
    """A ``redis.asyncio`` client with ``timeout_s`` to connect and per command, no retries
    of its own (the sync loop retries at its next tick), answers decoded as UTF-8 text (every
    key and value the state writes is text)."""
    return Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
        health_check_interval=0,
        decode_responses=True,
    )


@contextlib.asynccontextmanager
async def shared_state(
    gateway: Gateway,
    settings: Settings,
    table: QuarantineTable,
    affinity: ResponseAffinity,
    tasks: BackgroundTasks,
) -> AsyncIterator[StateView]:
    """The state backend of ``gateway``'s config for the block's duration (module
    docstring); the sync loop is a task of ``tasks``, cancelled before this block exits.
    ``affinity``: the app's (shared only when it says so)."""
    state = gateway.config.state

    def on_reload() -> None:
        if gateway.config.state != state:
            logger.warning("config reload: the state block changed; it applies at the next start")

    gateway.reload_hooks.append(on_reload)
    try:
        if state.backend == "embedded" or affinity.pending is None:
            yield StateView()
            return
        # an empty SPECGATE_STATE_URL (compose's ``${SPECGATE_STATE_URL:-}``) is no override
        secret = settings.state_url.get_secret_value() if settings.state_url else ""
        url = secret or state.url or ""
        old = gateway.feedback.learner
        learner = SharedLearner(old.decay)
        learner.groups, learner.observations = old.groups, old.observations
        gateway.feedback.learner = learner
        replica = settings.replica_id or socket.gethostname()
        shared = Shared(
            learner,
            QuarantineMirror(table, replica=replica, prefix=state.key_prefix),
            RefusalMirror(gateway.spec_params, prefix=state.key_prefix),
            AffinityMirror(affinity, prefix=state.key_prefix, interval_s=state.sync_interval_s),
        )
        client = redis_client(url, state.timeout_s)
        link = RedisState(client, state, shared, where=redacted(url), replica=replica)
        try:
            await link.sync()
            tasks.every(state.sync_interval_s, link.sync, "specgate-state-sync")
            yield StateView(link)
        finally:
            await client.aclose()
    finally:
        gateway.reload_hooks.remove(on_reload)
