"""Real sockets: the gateway and fake backends under uvicorn, driven by the OpenAI SDK.

Fault injection only (the fakes die mid-stream); real vLLM lives in tests/integration.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest

from contracts.config import parse_config
from gateway.app import create_app
from gateway.settings import Settings
from tests.fakes.fake_vllm import FakeBehaviour, create_fake_vllm
from tests.fakes.servers import free_port, running_server

MODEL = "smollm2-135m-instruct"


@dataclass
class Stack:
    url: str
    fakes: dict[str, FakeBehaviour]


@pytest.fixture
def stack() -> Iterator[Stack]:
    fakes = {"plain": FakeBehaviour(name="plain"), "ngram": FakeBehaviour(name="ngram")}
    with (
        running_server(create_fake_vllm(fakes["plain"])) as plain_url,
        running_server(create_fake_vllm(fakes["ngram"])) as ngram_url,
    ):
        config = parse_config(
            {
                "defaults": {"pool": "plain"},
                "backends": {
                    "plain": {"url": plain_url, "model": MODEL},
                    "ngram": {
                        "url": ngram_url,
                        "model": MODEL,
                        "speculation": {"method": "ngram", "num_speculative_tokens": 4},
                    },
                    "gone": {"url": f"http://127.0.0.1:{free_port()}", "model": MODEL},
                },
                "pools": {"plain": ["plain"], "spec": ["gone", "ngram"]},
                "rules": [
                    {
                        "name": "code",
                        "match": {"tasks": ["code"]},
                        "pool": "spec",
                        "fallbacks": ["plain"],
                    }
                ],
            }
        )
        app = create_app(Settings(health_interval_s=60), config=config)
        with running_server(app) as url:
            yield Stack(url, fakes)


@pytest.fixture
def client(stack: Stack) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_sdk_stream_chunk_by_chunk(client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model=MODEL, prompt="hi", max_tokens=8, stream=True))
    assert [c.choices[0].text for c in chunks] == [f" w{i}" for i in range(8)]


def test_stopped_backend_is_skipped(client: openai.OpenAI) -> None:
    resp = client.completions.with_raw_response.create(
        model=MODEL, prompt="x", max_tokens=4, extra_headers={"X-Task-Type": "code"}
    )
    assert resp.headers["x-specgate-backend"] == "ngram"
    assert resp.headers["x-specgate-rule"] == "code"


def test_stream_that_dies_midway_ends_with_error_then_done(stack: Stack) -> None:
    stack.fakes["plain"].die_after = 3
    import httpx

    with httpx.stream(
        "POST",
        f"{stack.url}/v1/completions",
        json={"model": MODEL, "prompt": "x", "stream": True},
        headers={"x-task-type": "chat"},
    ) as resp:
        events = [line for line in resp.iter_lines() if line]
    assert resp.headers["x-specgate-backend"] == "plain"
    assert len(events) == 5
    assert '"code": "upstream_error"' in events[3]
    assert events[4] == "data: [DONE]"


def test_non_streamed_answer_cut_midway_is_502(stack: Stack, client: openai.OpenAI) -> None:
    """Cut on every backend: the request moves on once (the client had nothing), then 502."""
    for fake in stack.fakes.values():
        fake.die_after = 3
    with pytest.raises(openai.APIStatusError) as info:
        client.completions.create(
            model=MODEL, prompt="x", max_tokens=4, extra_headers={"X-Task-Type": "chat"}
        )
    assert info.value.status_code == 502
    assert info.value.body["code"] == "upstream_error"  # type: ignore[index]
    assert [len(f.received) for f in stack.fakes.values()] == [1, 1]


def test_the_sdk_error_of_a_gateway_refusal_has_its_request_id(
    stack: Stack, client: openai.OpenAI
) -> None:
    """The OpenAI SDK reads ``x-request-id`` into ``APIStatusError.request_id``: a request
    the gateway refuses itself (an unknown model, 404) carries the one the client sent."""
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(
            model="no-such-model", prompt="x", extra_headers={"X-Request-Id": "sdk-1"}
        )
    assert info.value.request_id == "sdk-1"
    assert info.value.body["code"] == "model_not_found"  # type: ignore[index]


def test_backend_gets_the_clients_bytes_and_headers_only(stack: Stack) -> None:
    """Over real sockets (aiohttp to the backends): the body bytes are the client's, and
    no header is added but the request id (no Content-Type, User-Agent or Accept-Encoding
    of the gateway's own), credentials and hop-by-hop headers stay behind."""
    raw = b'{"model": "smollm2-135m-instruct", "prompt": "hello",   "max_tokens": 4, "top_k": 3}'
    sent = {
        "content-type": "application/json",
        "x-custom": "kept",
        "accept-encoding": "gzip",
        "authorization": "Bearer client-secret",
    }
    with httpx.Client(headers={"user-agent": "probe/1"}) as http:
        resp = http.post(f"{stack.url}/v1/completions", content=raw, headers=sent)
    assert resp.status_code == 200, resp.text
    [got] = stack.fakes["plain"].received
    assert got["body"] == raw
    headers = got["headers"]
    assert headers["content-type"] == "application/json"
    assert headers["x-custom"] == "kept" and headers["user-agent"] == "probe/1"
    assert headers["accept-encoding"] == "gzip"  # the client's, not aiohttp's default
    assert headers["x-request-id"] == resp.headers["x-request-id"]
    assert "authorization" not in headers
    assert int(headers["content-length"]) == len(raw)


def test_non_ascii_header_reaches_the_backend_as_sent(stack: Stack) -> None:
    request_id = "r-\u2713".encode()  # UTF-8 bytes e2 9c 93
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    url = f"{stack.url}/v1/completions"
    resp = httpx.post(url, json=body, headers={"x-request-id": request_id})
    assert resp.status_code == 200
    [got] = stack.fakes["plain"].received
    assert got["headers"]["x-request-id"].encode("latin-1") == request_id  # Starlette: Latin-1
    assert dict(resp.headers.raw)[b"x-request-id"] == request_id


def test_streams_cut_by_dying_backends_quarantine_at_the_second_death(stack: Stack) -> None:
    """No engine error (the stream breaks off, /health fails): the lone request is a
    suspect at the first death (an outside kill looks the same), quarantined at the second."""
    for fake in stack.fakes.values():
        fake.die_after, fake.healthy = 3, False  # the stream breaks off and the server is gone
    body = {"model": MODEL, "prompt": "x", "stream": True}
    url = f"{stack.url}/v1/completions"
    for task, backend, verdict in (
        ("chat", "plain", "only a suspect"),
        ("code", "ngram", "now refused"),
    ):
        with httpx.stream("POST", url, json=body, headers={"x-task-type": task}) as resp:
            events = [line for line in resp.iter_lines() if line]
            assert resp.headers["x-specgate-backend"] == backend
        assert '"code": "backend_died"' in events[3] and events[4] == "data: [DONE]"
        assert verdict in events[3]
    again = httpx.post(url, json=body | {"stream": False}, headers={"x-task-type": "code"})
    assert again.status_code == 422 and again.json()["error"]["code"] == "request_quarantined"
    assert [len(f.received) for f in stack.fakes.values()] == [1, 1]


def test_sdk_default_retries_stop_at_the_quarantine(stack: Stack) -> None:
    """The issue's scenario on fakes: the OpenAI SDK's defaults (2 retries on a 500) kill
    one backend, get one 500, then the quarantine's 422 ends the retries."""
    for fake in stack.fakes.values():
        fake.poison = "\u0436" * 20
    messages = [{"role": "user", "content": "\u0436" * 40}]
    with openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused") as sdk:  # max_retries=2
        with pytest.raises(openai.UnprocessableEntityError) as info:
            sdk.chat.completions.create(model=MODEL, messages=messages, seed=1)  # type: ignore[arg-type]
    assert info.value.body["code"] == "request_quarantined"  # type: ignore[index]
    assert [f.name for f in stack.fakes.values() if f.engine_dead] == ["plain"]
    assert sum(len(f.received) for f in stack.fakes.values()) == 1
    ready = httpx.get(f"{stack.url}/ready")
    assert ready.status_code == 200 and ready.json()["healthy_backends"] == ["ngram"]


@pytest.mark.parametrize("path", ["/v1/completions", "/invocations", "/tokenize"])
@pytest.mark.parametrize(
    ("name", "value"),
    [
        (b"x-request-id", "r\u00e9".encode()),  # the examples: 500 on relayed paths
        (b"x-title", "Caf\u00e9".encode()),
        (b"x-title", b"caf\xe9"),  # not UTF-8: its Latin-1 reading, written back as UTF-8
        (b"x-title", b"v" * 12_000),  # long, under both servers' limits
    ],
)
def test_header_values_on_every_path_over_sockets(
    stack: Stack, path: str, name: bytes, value: bytes
) -> None:
    """The default (aiohttp) upstream engine, real HTTP parsers on both sides."""
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    resp = httpx.post(f"{stack.url}{path}", json=body, headers=[(name, value), (name, b"2nd")])
    assert resp.status_code == 200, resp.text
    [got] = stack.fakes["plain"].received
    sent = got["headers"][name.decode()].encode("latin-1")  # Starlette reads Latin-1
    assert sent == (value if value != b"caf\xe9" else "caf\u00e9".encode())


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/invocations", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/chat/completions/batch", {"messages": [[{"role": "user", "content": "hi"}]]}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ],
)
def test_a_client_that_leaves_a_non_streamed_request_stops_the_backend(
    stack: Stack, path: str, body: dict[str, object]
) -> None:
    """The issue's measurement: vLLM went on generating for 55-80 s after the client of a
    non-streamed /invocations left. Now the gateway closes the upstream request at once
    (the fake, like vLLM, aborts a request whose connection closes)."""
    plain = stack.fakes["plain"]
    plain.first_delay_s = 10.0  # a long generation
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{stack.url}{path}", json={"model": MODEL} | body, timeout=0.5)
    deadline = time.monotonic() + 2.0
    while plain.closed_early == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert plain.closed_early == 1
    plain.first_delay_s = 0.0
    assert httpx.post(f"{stack.url}{path}", json={"model": MODEL} | body).status_code == 200
