"""The few OpenAI request fields the gateway reads to route, validated for type only.

The client's body is forwarded byte for byte; these models only check that the fields routing
depends on have usable types (so ``"temperature": "hot"`` is a 400, not a 500). Every other
field, vLLM extras included (``top_k``, ``min_p``, ``return_token_ids``, ``priority``...), is
ignored here and reaches the backend untouched.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError

from gateway.errors import GatewayError, bad_request

StrictFloat = Annotated[float, Strict()]
StrictBool = Annotated[bool, Strict()]
StrictStr = Annotated[str, Strict()]


class _RoutedRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: StrictStr = Field(min_length=1)
    temperature: StrictFloat | None = None
    stream: StrictBool | None = None


class CompletionFields(_RoutedRequest):
    """``POST /v1/completions``: ``prompt`` is a string, strings, token ids, or lists of ids."""

    prompt: str | list[Any]


class ChatCompletionFields(_RoutedRequest):
    """``POST /v1/chat/completions``: ``messages`` is a list of message objects."""

    messages: list[dict[str, Any]]


def openapi_body(kind: type[_RoutedRequest]) -> dict[str, Any]:
    """``openapi_extra`` documenting a routed endpoint's JSON body: the fields the gateway
    reads, any other OpenAI or vLLM field allowed (it is forwarded untouched)."""
    schema = kind.model_json_schema() | {"additionalProperties": True}
    content = {"application/json": {"schema": schema}}
    return {"requestBody": {"required": True, "content": content}}


def validate_fields(
    kind: type[_RoutedRequest], body: Any
) -> CompletionFields | ChatCompletionFields:
    """Check the routed fields of a parsed JSON body.

    Raises :class:`GatewayError` 400 naming the first bad field (OpenAI's ``param``).
    """
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    try:
        return kind.model_validate(body)  # type: ignore[return-value]
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        detail = "is required" if err["type"] == "missing" else f"is invalid: {err['msg']}"
        raise GatewayError(400, f"'{param}' {detail}", param=param, code="invalid_value") from None
