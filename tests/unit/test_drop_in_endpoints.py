"""Endpoints vLLM serves answer through the gateway too (issue #18, items 2 and 4)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from httpx_sse import aconnect_sse

from gateway.classify.classifier import classify
from gateway.classify.protocol import MessagesFields, ResponsesFields, read_fields, routing_view
from gateway.upstream.endpoints import is_client_path, match, openapi_templates
from tests.fakes.fake_vllm import FakeBehaviour
from tests.unit.conftest import MODEL, ROOT, InProcess, gateway_settings, in_process

RESPONSES = {"model": MODEL, "input": "Say hi", "max_output_tokens": 8}
MESSAGES = {
    "model": MODEL,
    "max_tokens": 8,
    "system": "You are terse.",
    "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hi"}]}],
}
CODE_TASK = (
    "Write a Python function that parses this CSV:\n```python\ndef parse(path):\n    pass\n```"
)


async def test_responses_is_routed(gw: InProcess) -> None:
    """The issue's example (Codex, the OpenAI Agents SDK)."""
    resp = await gw.client.post("/v1/responses", json=RESPONSES)
    assert resp.status_code == 200
    assert resp.json()["object"] == "response"
    assert resp.headers["x-specgate-rule"] == "hot-plain"  # no temperature: 1.0
    assert resp.headers["x-specgate-backend"] == "plain"


async def test_messages_is_routed(gw: InProcess) -> None:
    """The issue's example (Claude Code, Anthropic SDK clients)."""
    resp = await gw.client.post("/v1/messages", json=MESSAGES)
    assert resp.status_code == 200
    assert resp.json()["type"] == "message"


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
async def test_messages_errors_of_the_gateway_are_in_anthropics_shape(
    gw: InProcess, path: str
) -> None:
    """As vLLM's Messages router answers (``{"type": "error", "error": {"type", "message"}}``,
    with Anthropic's type for the status): what an Anthropic SDK client parses; the other
    paths keep OpenAI's envelope. (A body that is no JSON is the backend's to answer on the
    relayed count_tokens.)"""
    cases: list[tuple[dict | bytes, int, str]] = [
        (MESSAGES | {"model": "nope"}, 404, "not_found_error")
    ]
    if path == "/v1/messages":
        cases.append((b"{not json", 400, "invalid_request_error"))
        cases.append((json.dumps(MESSAGES).encode() + b" " * 9 * 2**20, 413, "request_too_large"))
    for body, status, kind in cases:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        resp = await gw.client.post(path, content=content)
        assert resp.status_code == status, resp.text
        error = resp.json()
        assert error["type"] == "error" and set(error["error"]) == {"type", "message"}
        assert error["error"]["type"] == kind and error["error"]["message"]
    # a method no route of the path takes
    resp = await gw.client.options(path)
    assert resp.status_code == 405
    message = f"OPTIONS is not allowed on {path}."
    assert resp.json() == {"type": "error", "error": {"type": "invalid_request_error",
                                                      "message": message}}  # fmt: skip
    resp = await gw.client.post("/v1/chat/completions", json={"model": "nope", "messages": []})
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/responses",
            {"model": MODEL, "temperature": 0, "instructions": "Code only.", "input": CODE_TASK},
        ),
        (
            "/v1/responses",
            {
                "model": MODEL,
                "temperature": "0",
                "input": [{"role": "user", "content": [{"type": "input_text", "text": CODE_TASK}]}],
            },
        ),
        (
            "/v1/messages",
            {
                "model": MODEL,
                "temperature": 0,
                "max_tokens": 8,
                "system": [{"type": "text", "text": "Code only."}],
                "messages": [{"role": "user", "content": CODE_TASK}],
            },
        ),
    ],
)
async def test_task_and_temperature_are_read_from_each_shape(
    gw: InProcess, path: str, body: dict
) -> None:
    resp = await gw.client.post(path, json=body)
    assert resp.status_code == 200
    assert resp.headers["x-specgate-task"] == "code"
    assert resp.headers["x-specgate-rule"] == "code-rag-speculative"
    explained = await gw.client.post("/routes/explain", json={"body": body, "endpoint": path})
    assert explained.json()["task"] == "code"


def test_views_read_tools_and_blocks() -> None:
    body = {
        "model": MODEL,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "content": "sunny"}]},
        ],
        "tools": [{"name": "weather", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any"},
    }
    view = routing_view(MessagesFields, body, read_fields(MessagesFields, body))
    assert view["tool_choice"] == "required"
    assert view["messages"][2]["content"] == [{"type": "text", "text": "sunny"}]
    assert classify(view, default_task="chat").task == "chat"  # a weather tool call is no code
    responses = {
        "input": [{"type": "function_call_output", "output": "42"}],
        "text": {"format": {"type": "json_schema"}},
    }
    view = routing_view(ResponsesFields, responses, read_fields(ResponsesFields, responses))
    assert view["response_format"] == {"type": "json_schema"}
    assert view["messages"] == [{"role": "tool", "content": [{"type": "text", "text": "42"}]}]


@pytest.mark.parametrize("stream", [False, True])
async def test_stored_responses_reach_the_backend_that_holds_them(
    gw: InProcess, stream: bool
) -> None:
    body = RESPONSES | {"temperature": 0, "input": CODE_TASK, "stream": stream}
    if stream:
        async with aconnect_sse(gw.client, "POST", "/v1/responses", json=body) as source:
            holder = source.response.headers["x-specgate-backend"]
            events = [sse async for sse in source.aiter_sse()]
        assert [e.event for e in events] == ["response.created", "response.completed"]
        rid = json.loads(events[0].data)["response"]["id"]
    else:
        resp = await gw.client.post("/v1/responses", json=body)
        holder, rid = resp.headers["x-specgate-backend"], resp.json()["id"]
    assert rid in gw.fakes[holder].stored
    for _ in range(4):
        got = await gw.client.get(f"/v1/responses/{rid}")
        assert got.status_code == 200 and got.json()["id"] == rid
        assert got.headers["x-specgate-backend"] == holder
    cancelled = await gw.client.post(f"/v1/responses/{rid}/cancel")
    assert cancelled.json()["status"] == "cancelled"
    follow = RESPONSES | {"previous_response_id": rid, "temperature": 1.5}
    resp = await gw.client.post("/v1/responses", json=follow)
    assert resp.headers["x-specgate-backend"] == holder


async def test_unknown_response_ids_are_looked_up_on_every_backend(gw: InProcess) -> None:
    gw.fakes["draft"].stored["resp_old"] = {"id": "resp_old", "object": "response"}
    got = await gw.client.get("/v1/responses/resp_old")
    assert got.status_code == 200 and got.headers["x-specgate-backend"] == "draft"
    missing = await gw.client.get("/v1/responses/resp_nowhere")
    assert missing.status_code == 404


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/tokenize", {"model": MODEL, "prompt": "hi"}),
        ("POST", "/detokenize", {"model": MODEL, "tokens": [1, 2]}),
        ("GET", "/version", None),
        ("POST", "/v1/messages/count_tokens", MESSAGES),
    ],
)
async def test_other_client_paths_are_relayed(
    gw: InProcess, method: str, path: str, body: dict | None
) -> None:
    resp = await gw.client.request(method, path, json=body)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-specgate-backend"] == "plain"  # plain first
    if body is not None:
        assert resp.json()["body"] == body


async def test_operator_paths_are_admin_only(gw: InProcess) -> None:
    for path in ("/reset_prefix_cache", "/scale_elastic_ep"):
        resp = await gw.client.post(path)
        assert resp.status_code == 404
        assert "operator endpoint" in resp.json()["error"]["message"]
    assert not any(
        r["path"] == "/reset_prefix_cache" for f in gw.fakes.values() for r in f.received
    )
    resp = await gw.client.post("/routes/backends/ngram/reset_prefix_cache")
    assert resp.status_code == 200 and resp.json()["served_by"] == "ngram"
    resp = await gw.client.post("/routes/backends/nope/reset_prefix_cache")
    assert resp.status_code == 404


async def test_unknown_paths_and_methods(gw: InProcess) -> None:
    assert (await gw.client.get("/v1/nothing")).status_code == 404
    resp = await gw.client.get("/tokenize")
    assert resp.status_code == 405 and resp.headers["allow"] == "POST"
    resp = await gw.client.get("/v1/messages")
    assert resp.status_code == 405 and resp.headers["allow"] == "POST"


@pytest.mark.parametrize("method", ["HEAD", "OPTIONS"])
async def test_head_and_options_are_answered_as_a_vllm_server_answers_them(
    gw: InProcess, method: str
) -> None:
    """vLLM's routes take neither method and it has no catch-all: an unknown path is a 404
    and a path it serves a 405, whatever the method; neither is relayed."""
    assert (await gw.client.request(method, "/v1/nothing")).status_code == 404
    resp = await gw.client.request(method, "/tokenize")
    assert resp.status_code == 405 and resp.headers["allow"] == "POST"
    assert not any(
        r["path"] in ("/v1/nothing", "/tokenize") for f in gw.fakes.values() for r in f.received
    )


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", "/routes/explain", "POST"),  # an admin route answering POST only
        ("PUT", "/routes/reload", "POST"),
        ("POST", "/health", "GET"),
        ("POST", "/ready", "GET"),
        ("DELETE", "/v1/models", "GET"),
        ("PATCH", "/routes/quarantine", "DELETE, GET"),
    ],
)
async def test_the_gateways_own_paths_answer_405_for_other_methods(
    gw: InProcess, method: str, path: str, allow: str
) -> None:
    """A path the gateway serves itself is neither relayed nor a 404 for another method:
    405 with the methods it takes, in OpenAI's envelope."""
    resp = await gw.client.request(method, path)
    assert resp.status_code == 405 and resp.headers["allow"] == allow
    assert resp.json()["error"]["code"] == "method_not_allowed"
    assert not any(r["path"] == path for f in gw.fakes.values() for r in f.received)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/models"])
async def test_options_is_405_with_the_code_every_other_method_gets(
    gw: InProcess, path: str
) -> None:
    """OPTIONS on the gateway's own routes is the gateway's 405, with the same envelope
    ``code`` as its other 405s, not the status number."""
    resp = await gw.client.options(path)
    assert resp.status_code == 405 and "allow" in resp.headers
    assert resp.json()["error"]["code"] == "method_not_allowed"
    assert resp.json()["error"]["type"] == "invalid_request_error"


async def test_model_cards_are_the_backends() -> None:
    """The issue's example: clients size their context from max_model_len."""
    fakes = {"ngram": FakeBehaviour(name="ngram", max_model_len=4096)}
    async with in_process(gateway_settings(), fakes=fakes) as gw:
        data = (await gw.client.get("/v1/models")).json()["data"]
    assert [card["id"] for card in data] == [MODEL]
    card = data[0]
    assert card["max_model_len"] == 4096  # the smallest of the backends serving it
    assert card["root"] == f"/models/{MODEL}" and card["parent"] is None
    assert card["permission"][0]["object"] == "model_permission"


async def test_one_model_card_as_the_openai_sdk_retrieves_it() -> None:
    """``client.models.retrieve(name)`` (``GET /v1/models/{name}``): the card ``/v1/models``
    lists; an unknown name is OpenAI's 404 ``model_not_found``, one with a slash too (the
    route takes ``org/model`` names, where the catch-all would answer ``not_found``)."""
    fakes = {"ngram": FakeBehaviour(name="ngram", max_model_len=4096)}
    async with in_process(gateway_settings(), fakes=fakes) as gw:
        listed = (await gw.client.get("/v1/models")).json()["data"][0]
        sdk = openai.AsyncOpenAI(
            api_key="k", base_url="http://gateway/v1", http_client=gw.client, max_retries=0
        )
        card = await sdk.models.retrieve(MODEL)
        assert card.model_dump(exclude_unset=True) == listed and card.max_model_len == 4096
        with pytest.raises(openai.NotFoundError) as raised:
            await sdk.models.retrieve("org/nope")
        assert raised.value.code == "model_not_found"
        resp = await gw.client.post(f"/v1/models/{MODEL}")
        assert resp.status_code == 405 and resp.headers["allow"] == "GET"


def test_vllm_openapi_paths_are_sorted_into_client_and_operator() -> None:
    schema = json.loads((ROOT / "tests" / "data" / "vllm-openapi-paths.json").read_text())
    templates = openapi_templates(schema)
    client = sorted(t.template for t in templates if is_client_path(t.template))
    assert "/tokenize" in client and "/v1/responses/{response_id}/cancel" in client
    operator = sorted(t.template for t in templates if not is_client_path(t.template))
    assert operator == [
        "/health",
        "/is_scaling_elastic_ep",
        "/kv_event_sources",
        "/load",
        "/metrics",
        "/scale_elastic_ep",
    ]
    found = match(templates, "/v1/responses/resp_1/cancel")
    assert found is not None and found.template == "/v1/responses/{response_id}/cancel"


async def test_passthrough_with_backends_down_is_503_or_404(gw: InProcess) -> None:
    for fake in gw.fakes.values():
        fake.healthy = False
    await gw.poll()
    resp = await gw.client.post("/tokenize", json={"prompt": "x"})
    assert resp.status_code in (404, 503)
    assert isinstance(resp.json()["error"]["message"], str)


async def test_passthrough_relays_query_strings(gw: InProcess) -> None:
    resp = await gw.client.post("/tokenize?x=1", json={"prompt": "x"})
    assert resp.status_code == 200
    [received] = gw.fakes["plain"].received
    assert received["path"] == "/tokenize"
    assert isinstance(resp, httpx.Response)
