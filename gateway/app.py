"""``create_app(settings)``: the FastAPI application and its lifespan.

The lifespan opens one :class:`~gateway.runtime.Runtime` (every long-lived object: the
forwarder's upstream client, the shared ``httpx.AsyncClient``, the
:class:`~gateway.service.Gateway` with its backend state, the prompt capture, the background
tasks; see :mod:`gateway.runtime`) on ``app.state.runtime`` and closes it on shutdown.
Importing this module does nothing.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute

from contracts.config import GatewayConfig
from gateway.api import admin, health, metrics, openai, passthrough, quarantine, status
from gateway.api.deps import with_request_id
from gateway.api.slashes import redirect_slash
from gateway.auth import build_auth, require_admin, require_client_key
from gateway.errors import GatewayError, from_upstream, status_code_name
from gateway.failures import UpstreamFailure
from gateway.runtime import Parts, open_runtime
from gateway.settings import Settings

logger = logging.getLogger(__name__)


def create_app(
    settings: Settings,
    *,
    config: GatewayConfig | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    rng: random.Random | None = None,
    processes: Callable[[], dict[str, Any]] | None = None,
) -> FastAPI:
    """Build the gateway app.

    ``config`` defaults to ``settings.load_config()`` (raises
    :class:`~contracts.config.ConfigError` at once, before anything listens; the known faults
    of the local vLLM engine attached, see :func:`~contracts.config.attach_engine_guards`); a
    given ``config`` is used as it is; raises :class:`~gateway.auth.InsecureSettings` for
    admin endpoints beyond loopback without a token; ``transport`` replaces the network for
    in-process tests; ``rng`` seeds routing tie breaks; ``processes`` is the supervisor's
    per-backend view under ``specgate up`` (:meth:`backends.supervisor.Supervisor.view`:
    restarts, last crash), shown on ``/routes``, ``/status`` and ``/metrics``.
    """
    config = config or settings.load_config()
    auth = build_auth(settings)
    parts = Parts(settings, config, auth, transport, rng, processes)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with open_runtime(parts) as runtime:
            app.state.runtime = runtime  # kept after shutdown: its counters stay readable
            yield

    app = SpecgateApp(title="specgate", version="0.1.0", lifespan=lifespan)
    client_key, admin_only = Depends(require_client_key(auth)), Depends(require_admin(auth))
    app.router.routes.extend(openai.proxy_routes(app.proxy_endpoints))  # auth checked inside
    routers = [(openai.router, [client_key]), (health.router, []), (metrics.router, [])]
    if settings.admin_enabled:
        routers += [(r, [admin_only]) for r in (admin.router, quarantine.router, status.router)]
    for router, dependencies in routers:
        app.include_router(router, dependencies=dependencies)
    # FastAPI wraps an included router (0.165) or copies its routes (older): read them from
    # the routers themselves (no prefix here), with the app's own (docs, the routed POSTs)
    included = (r for router, _ in routers for r in router.routes)
    app.own_routes = [r for r in (*app.router.routes, *included) if getattr(r, "methods", None)]
    if settings.admin_enabled:
        app.include_router(passthrough.admin_router, dependencies=[admin_only])
    # last: every other path a backend serves (after the gateway's own routes)
    keyless = Depends(require_client_key(auth, passthrough.KEYLESS_PATHS))
    app.include_router(passthrough.router, dependencies=[keyless])
    app.catch_all = app.router.routes[-1]
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


class SpecgateApp(FastAPI):
    """FastAPI whose routed endpoints (``POST /v1/completions``, ``/v1/chat/completions``)
    are dispatched before the middleware stack, straight to their raw ASGI apps
    (:class:`~gateway.api.openai.ProxyEndpoint`, which answer their own errors); every other
    request goes through FastAPI as usual. Measured in docs/benchmarks.md: Starlette's
    middleware and router cost about a tenth of the CPU of a proxied request. A path with a
    trailing slash that is served without it gets vLLM's 307 to it
    (:mod:`gateway.api.slashes`)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.proxy_endpoints = openai.proxy_endpoints()
        #: The relay's catch-all route (``/{path:path}``, included last by ``create_app``).
        self.catch_all: BaseRoute | None = None
        #: The routes the gateway answers itself (``create_app``): a path of theirs is never
        #: relayed, another method on it is a 405 (:mod:`gateway.api.passthrough`).
        self.own_routes: list[BaseRoute] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """ASGI entry point."""
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self.proxy_endpoints.get(scope["path"])
            if endpoint is not None:
                scope["app"] = self
                await endpoint(scope, receive, send)
                return
        if scope["type"] == "http" and scope["path"].endswith("/"):
            scope["app"] = self
            if await redirect_slash(self, scope, receive, send):
                return
        await super().__call__(scope, receive, send)


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error in OpenAI's envelope (on Anthropic's Messages paths in Anthropic's:
    :meth:`GatewayError.body_for`), with ``x-request-id``
    (:func:`with_request_id`): gateway errors, unknown routes and methods, and (never
    expected) unhandled exceptions as a 500 without a traceback."""

    @app.exception_handler(GatewayError)
    async def _gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
        body = exc.body_for(request.url.path)
        headers = with_request_id(request, exc.headers)
        return JSONResponse(body, status_code=exc.status, headers=headers)

    @app.exception_handler(UpstreamFailure)
    async def _upstream_failure(request: Request, exc: UpstreamFailure) -> JSONResponse:
        return await _gateway_error(request, from_upstream(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code, headers = status_code_name(exc.status_code), dict(exc.headers or {})
        error = GatewayError(exc.status_code, str(exc.detail), code=code, headers=headers)
        return await _gateway_error(request, error)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        error = GatewayError(400, str(exc.errors()[:1]), code="invalid")
        return await _gateway_error(request, error)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error")
        error = GatewayError(500, "Internal gateway error.", code="internal_error")
        return await _gateway_error(request, error)
