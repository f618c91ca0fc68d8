"""Per-request feedback on the relay: the gateway asks a stream for its usage chunk (where
vLLM puts ``metrics.speculative_decoding``), records it, and the client's bytes stay exactly
those a server that was not asked would have sent."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from contracts.config import parse_config
from gateway.app import create_app
from gateway.service import Gateway
from gateway.settings import Settings
from gateway.trace import RequestTrace
from gateway.upstream.attempt import Attempt
from gateway.upstream.feedback import ResponseTap, with_usage
from gateway.upstream.state import BackendRegistry
from tests.fakes.fake_spec_vllm import FINGERPRINT, SpecBehaviour, create_spec_vllm, spec_metrics
from tests.fakes.servers import running_server
from tests.fakes.transport import BackendsTransport
from tests.unit.conftest import MODEL, local_config

CODE = {"model": MODEL, "prompt": "def f(x):", "max_tokens": 6, "temperature": 0, "stream": True}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}


@dataclass
class Rig:
    client: httpx.AsyncClient
    fakes: dict[str, SpecBehaviour]
    gateway: Gateway


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    config = local_config()
    fakes = {name: SpecBehaviour() for name in config.backends}
    apps: dict[str, object] = {
        b.base_url.removeprefix("http://"): create_spec_vllm(fakes[name])
        for name, b in config.backends.items()
    }
    app = create_app(
        Settings(health_interval_s=60),
        config=config,
        transport=BackendsTransport(apps),
        rng=random.Random(3),
    )
    async with app.router.lifespan_context(app):
        gateway = app.state.runtime.gateway
        for state in gateway.registry.states.values():  # as if learnt from earlier answers
            state.fingerprint = json.dumps(FINGERPRINT).encode()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            yield Rig(client, fakes, gateway)


async def direct(behaviour: SpecBehaviour, path: str, body: dict[str, Any]) -> bytes:
    """What a client talking to the fake itself gets (a copy of the behaviour: the fake's
    request log stays the gateway's)."""
    app = create_spec_vllm(SpecBehaviour(**{**behaviour.__dict__, "received": []}))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://b") as c:
        return (await c.post(path, json=body)).content


async def via_gateway(rig: Rig, path: str, body: dict[str, Any]) -> httpx.Response:
    return await rig.client.post(path, json=body, headers={"x-task-type": "code"})


CASES = [
    ("/v1/completions", CODE),
    ("/v1/completions", CODE | {"stream_options": {}}),
    ("/v1/completions", CODE | {"stream_options": {"continuous_usage_stats": True}}),
    ("/v1/completions", CODE | {"stream_options": {"include_usage": False}}),
    ("/v1/chat/completions", CHAT | {"temperature": 0.0}),
]


@pytest.mark.parametrize("chunk_size", [None, 0, 1, 7, 64])
@pytest.mark.parametrize(("path", "body"), CASES)
async def test_stream_is_byte_identical_to_a_server_not_asked_for_usage(
    rig: Rig, path: str, body: dict[str, Any], chunk_size: int | None
) -> None:
    for fake in rig.fakes.values():
        fake.chunk_size = chunk_size
    resp = await via_gateway(rig, path, body)
    backend = resp.headers["x-specgate-backend"]
    assert resp.content == await direct(rig.fakes[backend], path, body)
    assert b'"usage"' not in resp.content and b'"system_fingerprint"' in resp.content
    sent = json.loads(rig.fakes[backend].received[-1])
    assert sent["stream_options"]["include_usage"] is True  # the gateway asked upstream
    assert not sent["stream_options"].get("continuous_usage_stats")
    [record] = rig.gateway.feedback.records()
    assert record["backend"] == backend and record["tokens"] == 10
    assert record["speculative_decoding"] == spec_metrics()
    assert record["acceptance_rate"] == 12 / 15


async def test_a_server_forcing_usage_looks_like_one_that_does_not(rig: Rig) -> None:
    """A server-side forced usage chunk (not continuous) is removed the same way."""
    for fake in rig.fakes.values():
        fake.force_usage = True
    body = CODE | {"stream_options": {"include_usage": False}}
    resp = await via_gateway(rig, "/v1/completions", body)
    plain_server = SpecBehaviour(force_usage=False)
    assert resp.content == await direct(plain_server, "/v1/completions", body)


async def test_without_fingerprint_the_terminal_chunk_is_untouched(rig: Rig) -> None:
    for fake in rig.fakes.values():
        fake.fingerprint = None
    for state in rig.gateway.registry.states.values():
        state.fingerprint = b""
    resp = await via_gateway(rig, "/v1/completions", CODE)
    assert resp.content == await direct(SpecBehaviour(fingerprint=None), "/v1/completions", CODE)


async def test_the_fingerprint_is_learnt_before_usage_is_asked_for(rig: Rig) -> None:
    """Until a backend's fingerprint is known, a stream goes as the client asked (nothing
    to strip, nothing held); its answer teaches the fingerprint."""
    for state in rig.gateway.registry.states.values():
        state.fingerprint = None
    resp = await via_gateway(rig, "/v1/completions", CODE)
    backend = resp.headers["x-specgate-backend"]
    assert resp.content == await direct(rig.fakes[backend], "/v1/completions", CODE)
    assert "stream_options" not in json.loads(rig.fakes[backend].received[-1])
    assert rig.gateway.registry.states[backend].fingerprint == json.dumps(FINGERPRINT).encode()
    for fake in rig.fakes.values():
        fake.fingerprint = None  # a server started with --fingerprint-mode none
    body = CODE | {"stream": False}
    resp = await via_gateway(rig, "/v1/completions", body)
    assert rig.gateway.registry.states[resp.headers["x-specgate-backend"]].fingerprint == b""


async def test_a_client_asking_for_usage_gets_it_unchanged(rig: Rig) -> None:
    body = CODE | {"stream_options": {"include_usage": True}}
    raw = json.dumps(body).encode()
    resp = await rig.client.post(
        "/v1/completions",
        content=raw,
        headers={"x-task-type": "code", "content-type": "application/json"},
    )
    backend = resp.headers["x-specgate-backend"]
    assert resp.content == await direct(rig.fakes[backend], "/v1/completions", body)
    assert b'"speculative_decoding"' in resp.content
    assert rig.fakes[backend].received[-1] == raw  # forwarded as sent
    assert rig.gateway.feedback.records()[-1]["speculative_decoding"] == spec_metrics()


async def test_json_answer_passes_metrics_through(rig: Rig) -> None:
    body = CODE | {"stream": False}
    resp = await via_gateway(rig, "/v1/completions", body)
    backend = resp.headers["x-specgate-backend"]
    assert resp.content == await direct(rig.fakes[backend], "/v1/completions", body)
    assert resp.json()["metrics"]["speculative_decoding"] == spec_metrics()
    assert rig.gateway.feedback.records()[-1]["speculative_decoding"] == spec_metrics()


async def test_other_observers_still_see_the_usage(rig: Rig) -> None:
    seen: list[RequestTrace] = []
    rig.gateway.observers.append(seen.append)
    await via_gateway(rig, "/v1/completions", CODE)
    assert seen[0].completion_tokens() == 10


async def test_feedback_off_forwards_the_body_as_sent(rig: Rig) -> None:
    rig.gateway.config.routing.feedback = False
    resp = await via_gateway(rig, "/v1/completions", CODE)
    sent = json.loads(rig.fakes[resp.headers["x-specgate-backend"]].received[-1])
    assert "stream_options" not in sent
    assert not rig.gateway.feedback.recent


def test_bytes_on_real_sockets_match() -> None:
    """Real TCP between the fake, the gateway and the client (reads cut anywhere)."""
    fake = SpecBehaviour(chunk_size=5)
    with running_server(create_spec_vllm(fake)) as fake_url:
        spec = {"method": "ngram", "num_speculative_tokens": 5}
        config = parse_config(
            {
                "defaults": {"pool": "spec"},
                "backends": {"ngram": {"url": fake_url, "model": MODEL, "speculation": spec}},
                "pools": {"spec": ["ngram"]},
            }
        )
        app: FastAPI = create_app(Settings(health_interval_s=60), config=config)
        with running_server(app) as gw_url:
            with httpx.stream("POST", f"{gw_url}/v1/completions", json=CODE) as r:
                through = b"".join(r.iter_raw())
            with httpx.stream("POST", f"{fake_url}/v1/completions", json=CODE) as r:
                alone = b"".join(r.iter_raw())
    assert through == alone and b"[DONE]" in through


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"stream": False}, None),
        ({"stream": True, "n": 2}, None),
        ({"stream": True, "stream_options": {"include_usage": True}}, None),
        ({"stream": True, "stream_options": "bad"}, None),
        ({"stream": True}, b'{"stream_options":{"include_usage":true},"stream": true}'),
    ],
)
def test_with_usage(body: dict[str, Any], expected: bytes | None) -> None:
    assert with_usage(json.dumps(body).encode(), body) == expected


def test_with_usage_keeps_other_stream_options() -> None:
    body = {"stream": True, "stream_options": {"include_usage": False, "x": 1}}
    forced = with_usage(json.dumps(body).encode(), body)
    assert forced is not None
    assert json.loads(forced)["stream_options"] == {
        "include_usage": True,
        "x": 1,
        "continuous_usage_stats": False,
    }


def test_tap_handles_crlf_and_a_blank_line_in_the_next_read() -> None:
    trace = RequestTrace("r", "completions", stream=True)
    trace.backend = "b"
    registry = BackendRegistry(["b"])
    registry.states["b"].fingerprint = b'"fp"'  # learnt from an earlier answer
    tap = ResponseTap(trace, strip=True, registry=registry)
    usage = b'{"choices":[],"usage":{"completion_tokens":2},"system_fingerprint":"fp"}'
    reads = [
        b'data: {"choices":[{"text":"a","finish_reason":null}]}\r\n\r\n',
        b'data: {"choices":[{"text":"b","finish_reason":"stop"}]}\r\n\r\ndata: ',
        usage + b"\r\n",
        b"\r\ndata: [DONE]\r\n\r\n",
    ]
    out = b"".join(tap.feed(r) for r in reads) + tap.close()
    assert out == (
        b'data: {"choices":[{"text":"a","finish_reason":null}]}\r\n\r\n'
        b'data: {"choices":[{"text":"b","finish_reason":"stop"}],"system_fingerprint":"fp"}'
        b"\r\n\r\ndata: [DONE]\r\n\r\n"
    )
    assert trace.completion_tokens() == 2


async def test_an_answered_request_times_its_backend_and_an_unanswered_one_does_not(
    rig: Rig,
) -> None:
    """How long a whole 200 answer to a routed generation held the backend feeds the mean by
    which scrapes of other clients' load there age (``BackendState.duration_s``); an
    attempt that ends without an answer (a failure, a refusal, a client that left) ends
    early and would shorten it, so it is not timed (pass-through answers: test_relayed)."""
    resp = await via_gateway(rig, "/v1/completions", CODE)
    state = rig.gateway.registry.states[resp.headers["x-specgate-backend"]]
    timed = state.duration_s
    assert resp.status_code == 200 and timed > 0
    attempt = Attempt("b", "http://b", state, None)
    attempt.begin("/v1/completions", None)
    assert state.inflight == 1
    attempt.end()
    assert state.inflight == 0 and state.duration_s == timed  # not timed
