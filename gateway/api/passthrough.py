"""Every other backend path: relayed as it is to a backend that serves it.

``/{path}`` (any method, after every other route): a path a backend lists in its
``/openapi.json`` (:class:`~gateway.upstream.catalog.BackendCatalog`) and that
:func:`~gateway.upstream.endpoints.is_client_path` allows is relayed to a healthy backend
listing it, serving the body's ``model`` when it names one: plain backends first, then the
least loaded (a stored Response's paths go to the backend that created it, see
:mod:`gateway.upstream.affinity`). Operator paths answer 404 here and are relayed only at
``/routes/backends/{backend}{path}``, behind the admin token (:data:`admin_router`).
Unknown paths are 404, known paths with another method 405, in OpenAI's envelope.

Not the hot path: it uses the app's shared ``httpx.AsyncClient``, its read timeout the
first-byte timeout; the answer is streamed back as it comes and the upstream response closed
when the relay ends or the client leaves.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from gateway.api.deps import GatewayDep, SettingsDep
from gateway.api.openai import read_body
from gateway.classify.protocol import ROUTED
from gateway.errors import GatewayError, model_not_found, no_backend
from gateway.runtime import runtime_of
from gateway.service import Gateway
from gateway.upstream.catalog import BackendCatalog
from gateway.upstream.endpoints import (
    OWN_PATHS,
    STATEFUL_TEMPLATES,
    PathTemplate,
    is_client_path,
    match,
)
from gateway.upstream.forward import client_headers, upstream_headers

logger = logging.getLogger(__name__)
router = APIRouter(tags=["passthrough"])
admin_router = APIRouter(tags=["admin"])
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


def _not_found(path: str, hint: str = "") -> GatewayError:
    return GatewayError(404, f"No endpoint {path}.{hint}", code="not_found")


def _not_allowed(method: str, path: str, allowed: str) -> GatewayError:
    return GatewayError(
        405,
        f"{method} is not allowed on {path}.",
        code="method_not_allowed",
        headers={"Allow": allowed},
    )


@router.api_route("/{path:path}", methods=METHODS, include_in_schema=False)
async def passthrough(
    request: Request, path: str, gateway: GatewayDep, settings: SettingsDep
) -> Response:
    """Relay a client path a backend serves (see the module docstring)."""
    path, method = "/" + path, request.method
    if path in OWN_PATHS or path in ROUTED:
        raise _not_allowed(method, path, "POST" if path in ROUTED else "GET")
    runtime = runtime_of(request.app)
    catalog = runtime.catalog
    names = [n for n, s in gateway.registry.states.items() if s.available] or list(
        gateway.config.backends
    )
    await catalog.refresh(gateway.config.backends, names)
    found = match([t for n in names for t in catalog.paths(n)], path)
    if found is None:
        raise _not_found(path)
    if not is_client_path(found.template):
        hint = " It is an operator endpoint: /routes/backends/{backend}" + path + " (admin)."
        raise _not_found(path, hint)
    if method not in found.methods:
        raise _not_allowed(method, path, ", ".join(sorted(found.methods)))
    body = await read_body(request.receive, request.headers, settings.max_body_bytes)
    order = _targets(gateway, catalog, found, path, body, runtime.affinity)
    stateful = found.template in STATEFUL_TEMPLATES
    return await relay(request, gateway, order, path, body, retry_404=stateful)


@admin_router.api_route(
    "/routes/backends/{backend}/{path:path}", methods=METHODS, include_in_schema=False
)
async def operator(
    request: Request, backend: str, path: str, gateway: GatewayDep, settings: SettingsDep
) -> Response:
    """Relay any path to one named backend (operator endpoints: ``reset_prefix_cache``,
    ``sleep``, ``wake_up``, ``start_profile``, ...); admin token only."""
    if backend not in gateway.config.backends:
        raise GatewayError(404, f"No backend named '{backend}'.", code="backend_not_found")
    body = await read_body(request.receive, request.headers, settings.max_body_bytes)
    return await relay(request, gateway, [backend], "/" + path, body)


def _targets(
    gateway: Gateway,
    catalog: BackendCatalog,
    found: PathTemplate,
    path: str,
    body: bytes,
    affinity: Any,
) -> list[str]:
    """Backends to try in order: the holder of a stored Response, else healthy backends
    listing the path and serving the body's ``model`` (plain first, least in flight)."""
    if found.template in STATEFUL_TEMPLATES:
        held = affinity.backend_of(path.split("/")[3])
        if held is not None and held in gateway.config.backends:
            return [held]
    model = _model_of(body)
    if model is not None and model not in gateway.served_models():
        raise model_not_found(model)
    snapshot = gateway.registry.snapshot()
    ranked = []
    for name, backend in gateway.config.backends.items():
        state = snapshot.get(name)
        if state is None or not state.healthy or state.circuit_open:
            continue
        if state.suspect is not None or state.sample_suspect is not None:
            continue  # a canary's verdict; a relayed body's temperature is not read here
        if found not in catalog.paths(name) or (model and backend.served_model != model):
            continue
        ranked.append((backend.spec.speculative, state.inflight, name))
    return [name for *_, name in sorted(ranked)]


def _model_of(body: bytes) -> str | None:
    """The JSON body's ``model`` when it is a non-empty string (else None)."""
    if not body.lstrip().startswith(b"{"):
        return None
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    model = data.get("model") if isinstance(data, dict) else None
    return model if isinstance(model, str) and model else None


async def relay(
    request: Request,
    gateway: Gateway,
    order: list[str],
    path: str,
    body: bytes,
    *,
    retry_404: bool = False,
) -> Response:
    """Send the request to the first backend of ``order`` that answers (the next on a
    connect error; with ``retry_404`` also on a 404, for a Response whose holder is not
    known) and stream its answer back; 503 when none answered."""
    client = runtime_of(request.app).client
    settings = runtime_of(request.app).settings
    headers = {k.lower(): v for k, v in request.headers.items()}
    response: httpx.Response | None = None
    served_by = ""
    for i, name in enumerate(order):
        backend = gateway.config.backends[name]
        url = httpx.URL(backend.base_url + path, query=request.url.query.encode())
        upstream = client.build_request(
            request.method, url, content=body, headers=upstream_headers(headers, backend)
        )
        upstream.extensions["timeout"]["read"] = settings.first_byte_timeout_s
        try:
            response = await client.send(upstream, stream=True)
        except httpx.HTTPError as exc:
            logger.info("passthrough %s: %s unreachable (%s)", path, name, type(exc).__name__)
            continue
        if retry_404 and response.status_code == 404 and i + 1 < len(order):
            await response.aclose()
            continue
        served_by = name
        break
    if response is None or not served_by:
        raise no_backend()
    relayed = StreamingResponse(_body(response), status_code=response.status_code)
    relayed.raw_headers = [
        *client_headers([(k.lower(), v) for k, v in response.headers.raw]),
        (b"x-specgate-backend", served_by.encode()),
    ]
    return relayed


async def _body(response: httpx.Response) -> AsyncIterator[bytes]:
    try:
        async for chunk in response.aiter_raw():
            yield chunk
    except httpx.HTTPError:
        logger.warning("passthrough: backend failed part-way")
    finally:
        await response.aclose()
