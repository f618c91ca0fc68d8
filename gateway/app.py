"""``create_app(settings)``: the FastAPI application and its lifespan.

The lifespan owns every long-lived object: the forwarder's upstream client (aiohttp, see
:mod:`gateway.upstream.client`), the shared ``httpx.AsyncClient`` of the health poller and
the canary (explicit timeouts and limits from settings), the
:class:`~gateway.service.Gateway` with its backend state, the opt-in prompt capture
(:mod:`gateway.capture`) and the background tasks.
Importing this module does nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from contracts.config import ConfigError, GatewayConfig, load_config
from gateway.api import admin, health, metrics, openai, passthrough, quarantine, status
from gateway.auth import build_auth, require_admin, require_client_key
from gateway.capture import capture_lifespan
from gateway.errors import GatewayError, error_envelope
from gateway.observability import observability
from gateway.persistence import persisted_learning
from gateway.quarantine import QuarantineTable
from gateway.service import Gateway
from gateway.settings import Settings
from gateway.upstream.affinity import ResponseAffinity
from gateway.upstream.canary import Canary
from gateway.upstream.catalog import BackendCatalog
from gateway.upstream.client import AiohttpUpstream, HttpxUpstream, UpstreamClient
from gateway.upstream.deaths import DeathWatch
from gateway.upstream.forward import Forwarder
from gateway.upstream.health import HealthPoller
from gateway.upstream.state import BackendRegistry

logger = logging.getLogger(__name__)


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
    limits = httpx.Limits(
        max_connections=settings.max_connections,
        max_keepalive_connections=settings.max_connections,
    )
    return httpx.AsyncClient(timeout=timeout, limits=limits, transport=transport)


def build_canary(settings: Settings, client: httpx.AsyncClient, gateway: Gateway) -> Canary | None:
    """The correctness canary when ``canary_interval_s > 0`` (else None); each canary request
    is bounded like a non-streamed generation, by ``first_byte_timeout_s``."""
    if settings.canary_interval_s <= 0:
        return None
    return Canary(
        client,
        lambda: gateway.config,
        gateway.registry,
        interval_s=settings.canary_interval_s,
        near_tie_margin=settings.canary_near_tie_margin,
        max_tokens=settings.canary_max_tokens,
        timeout_s=settings.first_byte_timeout_s,
    )


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


def create_app(
    settings: Settings,
    *,
    config: GatewayConfig | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    rng: random.Random | None = None,
    processes: Callable[[], dict[str, Any]] | None = None,
) -> FastAPI:
    """Build the gateway app.

    ``config`` defaults to ``load_config(settings.config)`` (raises
    :class:`~contracts.config.ConfigError` at once, before anything listens); raises
    :class:`~gateway.auth.InsecureSettings` for admin endpoints beyond loopback without a
    token; ``transport``
    replaces the network for in-process tests; ``rng`` seeds routing tie breaks;
    ``processes`` is the supervisor's per-backend view under ``specgate up``
    (:meth:`backends.supervisor.Supervisor.view`: restarts, last crash), shown on ``/routes``,
    ``/status`` and ``/metrics``.
    """
    config = config or load_config(settings.config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        registry = BackendRegistry(
            config.backends,
            circuit_failures=settings.circuit_failures,
            circuit_cooldown_s=settings.circuit_cooldown_s,
        )
        gateway = Gateway(config, rng, registry)
        async with build_client(settings, transport) as client:
            poller = HealthPoller(
                client,
                lambda: gateway.config,
                gateway.registry,
                interval_s=settings.health_interval_s,
                timeout_s=settings.health_timeout_s,
            )
            app.state.settings = settings
            app.state.gateway = gateway
            app.state.client = client
            app.state.catalog = BackendCatalog(
                client,
                ttl_s=settings.backend_catalog_ttl_s,
                timeout_s=max(settings.health_timeout_s, 5.0),
            )
            app.state.affinity = ResponseAffinity(
                max_entries=settings.response_affinity_max, ttl_s=settings.response_affinity_ttl_s
            )
            upstream = build_upstream(settings, client, transport)
            app.state.deaths = watch = build_death_watch(settings, client, registry)
            app.state.forwarder = Forwarder(
                upstream,
                max_attempts=settings.max_attempts,
                first_byte_timeout_s=settings.first_byte_timeout_s,
                idle_timeout_s=settings.idle_timeout_s,
                watch=watch,
            )
            app.state.poller = poller
            await poller.check_all()
            task = asyncio.create_task(poller.run(), name="specgate-health")
            app.state.canary = canary = build_canary(settings, client, gateway)
            canary_task = (
                None
                if canary is None
                else asyncio.create_task(canary.run(), name="specgate-canary")
            )
            install_sighup(gateway, settings)
            try:
                async with (
                    persisted_learning(gateway, settings),
                    observability(app, gateway, settings),
                    capture_lifespan(app, gateway, settings),
                ):
                    yield
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                if canary_task is not None:
                    canary_task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await canary_task
                await upstream.aclose()

    app = SpecgateApp(title="specgate", version="0.1.0", lifespan=lifespan)
    app.state.auth = build_auth(settings)
    app.state.processes = processes
    app.router.routes.extend(openai.proxy_routes(app.proxy_endpoints))  # auth checked inside
    app.include_router(openai.router, dependencies=[Depends(require_client_key)])
    app.include_router(health.router)
    app.include_router(metrics.router)
    if settings.admin_enabled:
        app.include_router(admin.router, dependencies=[Depends(require_admin)])
        app.include_router(quarantine.router, dependencies=[Depends(require_admin)])
        app.include_router(status.router, dependencies=[Depends(require_admin)])
        app.include_router(passthrough.admin_router, dependencies=[Depends(require_admin)])
    # last: every other path a backend serves (after the gateway's own routes)
    app.include_router(passthrough.router, dependencies=[Depends(require_client_key)])
    install_error_handlers(app)
    document_proxy_routes(app)
    return app


def document_proxy_routes(app: FastAPI) -> None:
    """Add the raw ASGI routed endpoints (not FastAPI routes) to the app's OpenAPI schema."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            schema["paths"] = openai.proxy_openapi_paths() | schema["paths"]
        return app.openapi_schema  # type: ignore[return-value]

    app.openapi = openapi  # type: ignore[method-assign]


def build_upstream(
    settings: Settings, client: httpx.AsyncClient, transport: httpx.AsyncBaseTransport | None
) -> UpstreamClient:
    """The forwarder's engine: aiohttp directly (default), or ``client`` when an in-process
    ``transport`` is given (tests) or ``SPECGATE_UPSTREAM_TRANSPORT=httpx``."""
    if transport is not None or settings.upstream_transport == "httpx":
        return HttpxUpstream(client)
    return AiohttpUpstream(
        max_connections=settings.max_connections, connect_timeout_s=settings.connect_timeout_s
    )


class SpecgateApp(FastAPI):
    """FastAPI whose routed endpoints (``POST /v1/completions``, ``/v1/chat/completions``)
    are dispatched before the middleware stack, straight to their raw ASGI apps
    (:class:`~gateway.api.openai.ProxyEndpoint`, which answer their own errors); every other
    request goes through FastAPI as usual. Measured in docs/benchmarks.md: Starlette's
    middleware and router cost about a tenth of the CPU of a proxied request."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.proxy_endpoints = openai.proxy_endpoints()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """ASGI entry point."""
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self.proxy_endpoints.get(scope["path"])
            if endpoint is not None:
                scope["app"] = self
                await endpoint(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def install_sighup(gateway: Gateway, settings: Settings) -> None:
    """Reload the config file on SIGHUP (only where the loop may own signals: the main
    thread of ``specgate serve``/``up``; elsewhere ``POST /routes/reload`` does it)."""

    def reload() -> None:
        try:
            gateway.reload(load_config(settings.config))
            logger.info("SIGHUP: reloaded %s", settings.config)
        except ConfigError as exc:
            logger.error("SIGHUP: kept the running config; %s", exc)

    with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload)


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error in OpenAI's envelope: gateway errors, unknown routes and methods,
    and (never expected) unhandled exceptions as a 500 without a traceback."""

    @app.exception_handler(GatewayError)
    async def _gateway_error(_: Request, exc: GatewayError) -> JSONResponse:
        return JSONResponse(exc.envelope(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        body = error_envelope(str(exc.detail), kind, None, str(exc.status_code))
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        body = error_envelope(str(exc.errors()[:1]), "invalid_request_error", None, "invalid")
        return JSONResponse(body, status_code=400)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error")
        body = error_envelope("Internal gateway error.", "server_error", None, "internal_error")
        return JSONResponse(body, status_code=500)
