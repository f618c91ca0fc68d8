"""The few request fields the gateway reads to route, read the way vLLM reads them.

The client's body is forwarded byte for byte, and the gateway is never stricter than the
backend: these models only *read* ``model``, ``temperature`` and ``stream``, in pydantic's lax
mode as vLLM's own request models do (``"temperature": "0.2"`` is 0.2, ``"stream": "true"``
is true). A field that cannot be read that way (``"temperature": "hot"``, ``"model": 7``) is
read as absent: the request is routed with the defaults and the backend judges it (vLLM
answers its own 400). Every other field, vLLM extras included (``top_k``, ``min_p``,
``return_token_ids``, ``priority``...), is ignored here and reaches the backend untouched.

Each routed endpoint has its fields class; ``view`` gives the chat-shaped body that routing
(features, classifier, prompt statistics) reads (see :mod:`gateway.classify.shapes`).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, NamedTuple

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from gateway.classify import shapes
from gateway.errors import bad_request

_FLOAT: TypeAdapter[float | None] = TypeAdapter(float | None)
_BOOL: TypeAdapter[bool | None] = TypeAdapter(bool | None)
_STR: TypeAdapter[str | None] = TypeAdapter(str | None)


class RoutedFields(BaseModel):
    """The routed fields of one request; None where absent or unreadable."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    temperature: float | None = None
    stream: bool | None = None

    #: The endpoint's path.
    path: ClassVar[str] = ""
    #: Whether answers carry OpenAI's ``usage`` chunk (feedback can ask for it).
    feedback: ClassVar[bool] = False

    @staticmethod
    def view(body: dict[str, Any]) -> dict[str, Any]:
        """The chat- or completions-shaped body routing reads (this endpoint's own)."""
        return body


class CompletionFields(RoutedFields):
    """``POST /v1/completions``: ``prompt`` is a string, strings, token ids, or lists of ids."""

    prompt: str | list[Any] | None = None
    path: ClassVar[str] = "/v1/completions"
    feedback: ClassVar[bool] = True


class ChatCompletionFields(RoutedFields):
    """``POST /v1/chat/completions``: ``messages`` is a list of message objects."""

    messages: list[dict[str, Any]] | None = None
    path: ClassVar[str] = "/v1/chat/completions"
    feedback: ClassVar[bool] = True


class ResponsesFields(RoutedFields):
    """``POST /v1/responses`` (OpenAI Responses): ``instructions``, ``input`` (a string or
    items), ``tools``; ``previous_response_id`` pins the backend that holds it."""

    instructions: str | None = None
    input: str | list[Any] | None = None
    tools: list[Any] | None = None
    previous_response_id: str | None = None
    path: ClassVar[str] = "/v1/responses"
    view = staticmethod(shapes.responses_view)


class MessagesFields(RoutedFields):
    """``POST /v1/messages`` (Anthropic Messages): ``system`` (a string or text blocks),
    ``messages`` (content blocks), ``tools``."""

    system: str | list[Any] | None = None
    messages: list[dict[str, Any]] | None = None
    tools: list[Any] | None = None
    path: ClassVar[str] = "/v1/messages"
    view = staticmethod(shapes.messages_view)


def openapi_body(kind: type[RoutedFields]) -> dict[str, Any]:
    """``openapi_extra`` documenting a routed endpoint's JSON body: the fields the gateway
    reads, any other field allowed (it is forwarded untouched)."""
    schema = kind.model_json_schema() | {"additionalProperties": True}
    content = {"application/json": {"schema": schema}}
    return {"requestBody": {"required": True, "content": content}}


def _field(adapter: TypeAdapter[Any], value: Any, exact: tuple[type, ...]) -> Any:
    """``value`` read with ``adapter`` (None when unreadable); a value of one of the
    ``exact`` types (what a client usually sends) is already what pydantic would return,
    and skips it: the hot path reads three fields per request."""
    if type(value) in exact:
        return value
    try:
        return adapter.validate_python(value)
    except (ValidationError, TypeError, ValueError):
        return None


class Fields(NamedTuple):
    """The routed fields of one request as :func:`read_fields` read them (None where absent
    or unreadable): :class:`RoutedFields`' values without a pydantic model per request."""

    model: str | None
    temperature: float | None
    stream: bool | None


def read_fields(kind: type[RoutedFields], body: Any) -> Fields:
    """The routed fields of a parsed JSON body, read leniently (see the module docstring).

    Raises :class:`~gateway.errors.GatewayError` 400 only when the body is not a JSON
    object (vLLM answers 400 to those too). A non-finite temperature (``"nan"``) reads as
    absent.
    """
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    temperature = _field(_FLOAT, body.get("temperature"), (float, type(None)))
    if temperature is not None and not math.isfinite(temperature):
        temperature = None
    model = _field(_STR, body.get("model"), (str, type(None)))
    return Fields(model or None, temperature, _field(_BOOL, body.get("stream"), (bool, type(None))))


def routing_view(kind: type[RoutedFields], body: dict[str, Any], fields: Fields) -> Any:
    """The body routing reads: ``kind.view(body)`` with ``temperature`` and ``stream`` as
    read (a shallow copy only when the client sent them in another form)."""
    view = kind.view(body)
    temperature, stream = view.get("temperature"), view.get("stream")
    if (temperature is not None and temperature != fields.temperature) or (
        stream is not None and stream is not fields.stream
    ):
        view = {**view, "temperature": fields.temperature, "stream": fields.stream}
    return view


#: The routed generation endpoints and how each request shape is read.
ROUTED: dict[str, type[RoutedFields]] = {
    kind.path: kind
    for kind in (CompletionFields, ChatCompletionFields, ResponsesFields, MessagesFields)
}


def kind_of(body: Any, endpoint: str | None = None) -> type[RoutedFields]:
    """The fields class of ``endpoint`` (one of :data:`ROUTED`), or, without one, guessed
    from the body: ``input``/``instructions`` is Responses, ``messages`` is chat (an
    Anthropic body with a top-level ``system`` is Messages), otherwise completions.
    Raises :class:`~gateway.errors.GatewayError` 400 for an endpoint not routed."""
    if endpoint is not None:
        if endpoint not in ROUTED:
            raise bad_request(f"'{endpoint}' is not a routed endpoint: one of {sorted(ROUTED)}")
        return ROUTED[endpoint]
    if not isinstance(body, dict):
        return CompletionFields
    if "input" in body or "instructions" in body:
        return ResponsesFields
    if "messages" in body:
        return MessagesFields if "system" in body else ChatCompletionFields
    return CompletionFields
