"""The gateway's runtime: every long-lived object of one app, typed, in one place.

:func:`open_runtime` builds a :class:`Runtime` on one :class:`contextlib.AsyncExitStack`
and tears it down in reverse order: background tasks first (one :class:`BackgroundTasks`
cancels them all), then the backend catalog's reads, the capture's flush, the metrics' and
learning's blocks (the final save), the SIGHUP handler, the forwarder's upstream client and
the shared httpx client.
``create_app``'s lifespan puts the runtime on ``app.state.runtime``; handlers reach it with
:func:`runtime_of`. Importing this module does nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from contracts.config import ConfigError, GatewayConfig
from gateway.auth import Auth
from gateway.background import BackgroundTasks
from gateway.classify.embedding_stage import load_stages
from gateway.errors import stream_failure_event
from gateway.observability import Observability, observability
from gateway.persistence import persisted_learning
from gateway.probe_port import ProbeServer, probe_port, readiness
from gateway.service import Gateway
from gateway.settings import Settings
from gateway.state.lifespan import StateCollector, StateView, shared_state
from gateway.telemetry.capture import Capture, capture_lifespan
from gateway.telemetry.history import AcceptanceHistory
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.sample_canary_metrics import SampleCanaryCollector
from gateway.telemetry.status import StatusPage
from gateway.upstream.affinity import ResponseAffinity
from gateway.upstream.canary import Canary
from gateway.upstream.catalog import BackendCatalog
from gateway.upstream.client import (
    AiohttpUpstream,
    HttpxUpstream,
    UpstreamClient,
)
from gateway.upstream.deaths import DeathWatch
from gateway.upstream.forward import Forwarder
from gateway.upstream.health import HealthPoller
from gateway.upstream.live_scoring import LiveScorer, LiveScoringBudget
from gateway.upstream.quarantine import QuarantineTable
from gateway.upstream.sample_canary import SampleCanary, SampleCanaryBudget
from gateway.upstream.state import BackendRegistry, Backends

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

logger = logging.getLogger(__name__)
D = TypeVar("D", bound="DataclassInstance")
Processes = Callable[[], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Runtime:
    """Every long-lived object of one running app (see the module docstring)."""

    settings: Settings
    auth: Auth
    processes: Processes | None
    gateway: Gateway
    client: httpx.AsyncClient
    catalog: BackendCatalog
    affinity: ResponseAffinity
    deaths: DeathWatch
    forwarder: Forwarder
    poller: HealthPoller
    canary: Canary | None
    sample_canary: SampleCanary | None
    live_scoring: LiveScorer | None
    metrics: GatewayMetrics
    history: AcceptanceHistory
    status_page: StatusPage
    capture: Capture
    tasks: BackgroundTasks
    state: StateView
    probe_server: ProbeServer | None = None  # SPECGATE_HEALTH_PORT's listener, when set


def runtime_of(app: Any) -> Runtime:
    """The :class:`Runtime` of a started app (raises :class:`RuntimeError` before its
    lifespan has started)."""
    runtime = getattr(app.state, "runtime", None)
    if not isinstance(runtime, Runtime):
        raise RuntimeError("the app's lifespan has not started")
    return runtime


@contextlib.contextmanager
def sighup_reload(gateway: Gateway, settings: Settings) -> Iterator[bool]:
    """Reload the config file on SIGHUP while the block runs; yields whether the handler
    was installed (only where the loop may own signals: the main thread of ``specgate
    serve``/``up``; elsewhere ``POST /routes/reload`` does it). Removed on exit."""

    def reload() -> None:
        try:
            gateway.reload(settings.load_config())
            logger.info("SIGHUP: reloaded %s", settings.config)
        except ConfigError as exc:
            logger.error("SIGHUP: kept the running config; %s", exc)

    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGHUP, reload)
    except (ValueError, RuntimeError, NotImplementedError):
        yield False
        return
    try:
        yield True
    finally:
        loop.remove_signal_handler(signal.SIGHUP)


def with_settings(cls: type[D], settings: Settings, prefix: str) -> D:
    """A ``cls`` (a dataclass) whose every field is the setting ``prefix`` + its name."""
    return cls(**{f.name: getattr(settings, prefix + f.name) for f in fields(cls)})


@dataclass(frozen=True, slots=True)
class Parts:
    """What :func:`open_runtime` is given: built by ``create_app`` from its arguments."""

    settings: Settings
    config: GatewayConfig
    auth: Auth
    transport: httpx.AsyncBaseTransport | None = None
    rng: random.Random | None = None
    processes: Processes | None = None


def build_client(
    settings: Settings, transport: httpx.AsyncBaseTransport | None
) -> httpx.AsyncClient:
    """The shared ``httpx.AsyncClient`` of the health poller and the canary (and of the
    forwarder with ``SPECGATE_UPSTREAM_TRANSPORT=httpx`` or an in-process ``transport``):
    connect and pool timeouts from settings, read timeout the idle gap between chunks (the
    forwarder widens it to ``first_byte_timeout_s`` until the response headers arrive); there
    is no total cap."""
    timeout = httpx.Timeout(
        connect=settings.connect_timeout_s,
        read=settings.idle_timeout_s,
        write=settings.idle_timeout_s,
        pool=settings.connect_timeout_s,
    )
    # No connection cap of httpcore's own: at its cap, a pool shared by several backends
    # closes an idle connection of one to open one to another, and can close one already
    # handed to a queued request, under that request (encode/httpcore#1110, open in 1.0.9;
    # measured in docs/benchmarks.md, "Keep-alive"). Admission (``max_inflight``) bounds the
    # requests in flight, and so the connections, instead.
    limits = httpx.Limits(
        max_connections=None,
        max_keepalive_connections=None,
        keepalive_expiry=settings.backend_keep_alive_s,
    )
    return httpx.AsyncClient(timeout=timeout, limits=limits, transport=transport)


def build_canary(settings: Settings, backends: Backends) -> Canary | None:
    """The correctness canary when ``canary_interval_s > 0`` (else None); each canary request
    is bounded like a non-streamed generation, by ``first_byte_timeout_s``."""
    if settings.canary_interval_s <= 0:
        return None
    return Canary(
        backends,
        interval_s=settings.canary_interval_s,
        near_tie_margin=settings.canary_near_tie_margin,
        max_tokens=settings.canary_max_tokens,
        timeout_s=settings.first_byte_timeout_s,
    )


def build_sample_canary(settings: Settings, backends: Backends) -> SampleCanary | None:
    """The distribution canary when ``sample_canary_interval_s > 0`` (the default; else
    None); each of its requests is bounded by ``first_byte_timeout_s``."""
    if settings.sample_canary_interval_s <= 0:
        return None
    budget = with_settings(SampleCanaryBudget, settings, "sample_canary_")
    return SampleCanary(backends, budget, timeout_s=settings.first_byte_timeout_s)


def build_live_scoring(settings: Settings, canary: SampleCanary | None) -> LiveScorer | None:
    """Live scoring when the distribution canary runs and
    ``sample_canary_live_tokens_per_minute > 0`` (the default; else None)."""
    if canary is None or settings.sample_canary_live_tokens_per_minute <= 0:
        return None
    budget = with_settings(LiveScoringBudget, settings, "sample_canary_live_")
    return LiveScorer(canary, budget)


def build_death_watch(
    settings: Settings, client: httpx.AsyncClient, registry: BackendRegistry
) -> DeathWatch:
    """Containment: the quarantine table and the death watch that fills it (probing
    ``/health`` with the shared client)."""
    table = QuarantineTable(
        ttl_s=settings.quarantine_ttl_s,
        max_entries=settings.quarantine_max_entries,
        strikes=settings.quarantine_strikes,
    )
    return DeathWatch(client, registry, table, probe_timeout_s=settings.death_probe_timeout_s)


def build_upstream(
    settings: Settings, client: httpx.AsyncClient, transport: httpx.AsyncBaseTransport | None
) -> UpstreamClient:
    """The forwarder's engine: aiohttp directly (default), or ``client`` when an in-process
    ``transport`` is given (tests) or ``SPECGATE_UPSTREAM_TRANSPORT=httpx``."""
    if transport is not None or settings.upstream_transport == "httpx":
        return HttpxUpstream(client)
    return AiohttpUpstream(
        max_connections=settings.max_connections,
        connect_timeout_s=settings.connect_timeout_s,
        keep_alive_s=settings.backend_keep_alive_s,
    )


@contextlib.asynccontextmanager
async def open_runtime(parts: Parts) -> AsyncIterator[Runtime]:
    """Build the runtime, probe every backend once, read the healthy ones' catalog (at most
    the catalog's ``timeout_s``), start the background tasks; on exit tear everything down
    (module docstring)."""
    settings = parts.settings
    async with contextlib.AsyncExitStack() as stack:
        registry = BackendRegistry(
            parts.config.backends,
            circuit_failures=settings.circuit_failures,
            circuit_cooldown_s=settings.circuit_cooldown_s,
            peak_window_s=settings.peak_window_s,
        )
        # ~50 ms of file reads, once: off the event loop all the same
        stages = await asyncio.to_thread(load_stages, settings.classifier_embedding_dir())
        gateway = Gateway(parts.config, parts.rng, registry, stages)
        client = await stack.enter_async_context(build_client(settings, parts.transport))
        upstream = build_upstream(settings, client, parts.transport)
        stack.push_async_callback(upstream.aclose)
        deaths = build_death_watch(settings, client, registry)
        forwarder = Forwarder(
            upstream,
            max_attempts=settings.max_attempts,
            first_byte_timeout_s=settings.first_byte_timeout_s,
            idle_timeout_s=settings.idle_timeout_s,
            watch=deaths,
            stream_failure=stream_failure_event,
        )
        backends = Backends(client, lambda: gateway.config, registry)
        poller = HealthPoller(
            backends,
            interval_s=settings.health_interval_s,
            timeout_s=settings.health_timeout_s,
            failures=settings.health_failures,
        )
        tasks = BackgroundTasks()
        stack.push_async_callback(tasks.aclose)  # should a later step fail
        await poller.check_all()
        tasks.every(settings.health_interval_s, poller.check_all, "specgate-health")
        canary = build_canary(settings, backends)
        if canary is not None:
            # the first round one interval after start, when the backends are warm
            tasks.every(canary.interval_s, canary.run_round, "specgate-canary")
        sample_canary = build_sample_canary(settings, backends)
        if sample_canary is not None:
            sample_canary.start(tasks)
        live_scoring = build_live_scoring(settings, sample_canary)
        if live_scoring is not None:
            tasks.start(live_scoring.run(), "specgate-live-scoring")
        stack.enter_context(sighup_reload(gateway, settings))
        await stack.enter_async_context(persisted_learning(gateway, settings, tasks))
        seen: Observability = stack.enter_context(
            observability(gateway, settings, deaths, parts.processes, tasks)
        )
        if sample_canary is not None:
            seen.metrics.registry.register(SampleCanaryCollector(sample_canary))
        capture = await stack.enter_async_context(capture_lifespan(gateway, settings, seen.metrics))
        affinity = ResponseAffinity(
            max_entries=settings.response_affinity_max,
            ttl_s=settings.response_affinity_ttl_s,
            shared=parts.config.state.backend == "redis",
        )
        state = await stack.enter_async_context(
            shared_state(gateway, settings, deaths.table, affinity, tasks)
        )
        seen.metrics.registry.register(StateCollector(state))
        catalog = BackendCatalog(
            client,
            ttl_s=settings.backend_catalog_ttl_s,
            timeout_s=max(settings.health_timeout_s, 5.0),
        )
        stack.push_async_callback(catalog.aclose)
        # read before the app is ready: a client's first /v1/models waited 2.0-3.0 s for the
        # CPU stack's first /openapi.json reads (session 44); startup waits timeout_s at
        # most (a read that trickles bytes goes on in the background)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(catalog.timeout_s):
                await catalog.warm(gateway.config.backends, registry)
        tasks.every(
            settings.health_interval_s,
            lambda: catalog.warm(gateway.config.backends, registry),
            "specgate-catalog",
        )
        stack.push_async_callback(tasks.aclose)  # first on teardown: no loop outlives its use
        probe_server = None
        if settings.health_port is not None:
            probe_server = await stack.enter_async_context(
                probe_port(
                    settings.host,
                    settings.health_port,
                    lambda: readiness(gateway.backends()),
                    tasks,
                    stale_after_s=settings.health_port_stale_s,
                )
            )
        yield Runtime(
            settings=settings,
            auth=parts.auth,
            processes=parts.processes,
            gateway=gateway,
            client=client,
            catalog=catalog,
            affinity=affinity,
            deaths=deaths,
            forwarder=forwarder,
            poller=poller,
            canary=canary,
            sample_canary=sample_canary,
            live_scoring=live_scoring,
            metrics=seen.metrics,
            history=seen.history,
            status_page=seen.status_page,
            capture=capture,
            tasks=tasks,
            state=state,
            probe_server=probe_server,
        )
