"""Fuzzing the API: schemathesis from the gateway's OpenAPI schema and hypothesis-generated
bodies. Whatever comes in, the answer is a backend's or a 4xx envelope, never a 5xx."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.config import parse_config
from gateway.app import create_app
from gateway.settings import Settings
from tests.fakes.fake_vllm import FakeBehaviour, create_fake_vllm
from tests.fakes.servers import free_port, running_server

MODEL = "smollm2-135m-instruct"


PLAIN_PORT, NGRAM_PORT = free_port(), free_port()
CONFIG = {
    "defaults": {"pool": "plain"},
    "backends": {
        "plain": {"url": f"http://127.0.0.1:{PLAIN_PORT}", "model": MODEL},
        "ngram": {
            "url": f"http://127.0.0.1:{NGRAM_PORT}",
            "model": MODEL,
            "speculation": {"method": "ngram", "num_speculative_tokens": 3},
        },
    },
    "pools": {"plain": ["plain"], "spec": ["ngram"]},
    "rules": [
        {"name": "code", "match": {"tasks": ["code"]}, "pool": "spec", "fallbacks": ["plain"]}
    ],
}


@pytest.fixture(scope="module")
def gateway_url() -> Iterator[str]:
    fakes = [FakeBehaviour(name=n, tokens=2) for n in ("plain", "ngram")]
    with (
        running_server(create_fake_vllm(fakes[0]), PLAIN_PORT),
        running_server(create_fake_vllm(fakes[1]), NGRAM_PORT),
    ):
        settings = Settings(health_interval_s=60, max_body_bytes=64 * 1024)
        with running_server(create_app(settings, config=parse_config(CONFIG))) as url:
            yield url


def api_schema() -> schemathesis.BaseSchema:
    """The gateway's own OpenAPI document (no server needed to build it)."""
    app = create_app(Settings(), config=parse_config(CONFIG))
    return schemathesis.openapi.from_dict(app.openapi())


@pytest.mark.parametrize(
    ("path", "method"),
    [
        ("/v1/completions", "POST"),
        ("/v1/chat/completions", "POST"),
        ("/v1/responses", "POST"),
        ("/v1/messages", "POST"),
        ("/v1/models", "GET"),
        ("/routes/explain", "POST"),
        ("/health", "GET"),
        ("/ready", "GET"),
        ("/routes", "GET"),
    ],
)
@given(data=st.data())
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_openapi_operations_never_5xx(
    gateway_url: str, path: str, method: str, data: st.DataObject
) -> None:
    """Schemathesis generates requests from the OpenAPI schema; none may get a 5xx."""
    operation = api_schema()[path][method]
    case = data.draw(operation.as_strategy())
    response = case.call(base_url=gateway_url)
    assert response.status_code < 500, (path, case.body, response.text)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
bodies = (
    st.fixed_dictionaries(
        {},
        optional={
            "model": st.sampled_from([MODEL, "unknown"]) | json_values,
            "prompt": st.text() | st.lists(st.integers(0, 50000)) | json_values,
            "messages": st.lists(
                st.fixed_dictionaries(
                    {"role": st.sampled_from(["user", "system", "tool"])},
                    optional={"content": st.text() | json_values},
                ),
                max_size=3,
            )
            | json_values,
            "temperature": st.floats(-1, 3) | json_values,
            "max_tokens": st.integers(-10, 10**12) | json_values,
            "stream": st.booleans() | json_values,
            "top_k": json_values,
            "tools": json_values,
            "response_format": json_values,
        },
    )
    | json_values
)


@given(body=bodies, chat=st.booleans())
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
def test_generated_bodies_never_5xx(gateway_url: str, body: object, chat: bool) -> None:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    resp = httpx.post(
        f"{gateway_url}{path}",
        content=json.dumps(body),
        timeout=10,
        headers={"content-type": "application/json"},
    )
    assert resp.status_code < 500, (body, resp.text)
    if resp.status_code >= 400:
        assert set(resp.json()["error"]) >= {"message", "type", "param", "code"}


@given(raw=st.binary(max_size=300))
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_random_bytes_never_5xx(gateway_url: str, raw: bytes) -> None:
    resp = httpx.post(f"{gateway_url}/v1/completions", content=raw, timeout=10)
    assert resp.status_code < 500
    try:
        parsed = json.loads(raw)
    except (ValueError, RecursionError):
        parsed = None
    if isinstance(parsed, dict):  # e.g. b'{"":""}': forwarded, the backend judges it
        return
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] in {"invalid_json", "invalid_value", None}


def test_oversized_headers_and_bodies(gateway_url: str) -> None:
    huge_header = {"x-junk": "a" * 200_000}
    try:
        resp = httpx.post(
            f"{gateway_url}/v1/completions",
            json={"model": MODEL, "prompt": "x"},
            headers=huge_header,
            timeout=10,
        )
        assert resp.status_code == 431
        assert resp.json()["error"]["code"] == "headers_too_large"
    except httpx.RemoteProtocolError:
        pass  # an h11 server closes the connection on an oversized header block: a refusal
    assert httpx.get(f"{gateway_url}/health").status_code == 200
    big = httpx.post(
        f"{gateway_url}/v1/completions", timeout=10, json={"model": MODEL, "prompt": "x" * 100_000}
    )
    assert big.status_code == 413
    for max_tokens in (-5, 10**15):
        resp = httpx.post(
            f"{gateway_url}/v1/completions",
            timeout=10,
            json={"model": MODEL, "prompt": "x", "max_tokens": max_tokens},
        )
        assert resp.status_code == 200  # passed through: the backend decides


blocks = st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "tool_use", "tool_result", "input_text", "image"])},
        optional={"text": st.text() | json_values, "content": json_values, "input": json_values},
    )
    | json_values,
    max_size=3,
)
shaped_bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from([MODEL, "unknown"]) | json_values,
        "temperature": st.floats(-1, 3) | st.sampled_from(["0.2", "hot", "nan"]) | json_values,
        "stream": st.booleans() | json_values,
        "system": st.text() | blocks | json_values,
        "instructions": st.text() | json_values,
        "input": st.text()
        | st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "role": st.sampled_from(["user", "developer", "assistant"]) | json_values,
                    "type": st.sampled_from(["message", "function_call_output", "reasoning"]),
                    "content": st.text() | blocks,
                    "output": json_values,
                },
            )
            | json_values,
            max_size=3,
        )
        | json_values,
        "messages": st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "role": st.sampled_from(["user", "assistant"]) | json_values,
                    "content": st.text() | blocks | json_values,
                },
            )
            | json_values,
            max_size=3,
        )
        | json_values,
        "tools": json_values,
        "tool_choice": json_values,
        "text": json_values,
        "previous_response_id": st.text(max_size=8) | json_values,
        "min_p": json_values,
        "logit_bias": json_values,
    },
)


@given(body=shaped_bodies, path=st.sampled_from(["/v1/responses", "/v1/messages"]))
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
def test_responses_and_messages_bodies_never_5xx(gateway_url: str, body: object, path: str) -> None:
    """Odd Responses and Messages bodies: routed with what can be read, never a 5xx."""
    resp = httpx.post(f"{gateway_url}{path}", content=json.dumps(body), timeout=10)
    assert resp.status_code < 500, (body, resp.text)
    explained = httpx.post(
        f"{gateway_url}/routes/explain",
        content=json.dumps({"body": body, "endpoint": path}),
        timeout=10,
    )
    assert explained.status_code < 500, (body, explained.text)


@given(
    path=st.sampled_from(["/tokenize", "/v1/responses/x", "/v1/responses/x/cancel", "/version"])
    | st.text(max_size=20).map(lambda p: "/" + p.lstrip("/")),
    method=st.sampled_from(["GET", "POST", "DELETE", "PUT"]),
    raw=st.binary(max_size=100),
)
@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
def test_passthrough_never_5xx(gateway_url: str, path: str, method: str, raw: bytes) -> None:
    try:
        resp = httpx.request(method, f"{gateway_url}{path}", content=raw, timeout=10)
    except httpx.InvalidURL:
        return
    assert resp.status_code < 500 or resp.status_code == 503, (path, resp.text)
