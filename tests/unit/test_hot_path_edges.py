"""Edges of the proxy path found by breaking it on purpose: odd bodies and headers from
clients, odd answers from backends, a failing observer. In process, fake backends."""

from __future__ import annotations

import json

import httpx
import pytest

from contracts.config import BackendConfig
from gateway.app import create_app
from gateway.errors import stream_failure_event
from gateway.settings import Settings
from gateway.trace import RequestTrace
from gateway.upstream.client import HttpxUpstream
from gateway.upstream.feedback import with_usage
from gateway.upstream.forward import Forwarder
from gateway.upstream.state import BackendRegistry
from tests.fakes.fake_vllm import FakeBehaviour, create_fake_vllm
from tests.fakes.transport import BackendsTransport
from tests.unit.conftest import MODEL, InProcess, local_config

STREAM = {"model": MODEL, "prompt": "hi", "max_tokens": 4, "stream": True}


@pytest.mark.parametrize(
    ("options", "forced"),
    [
        ({"include_usage": True}, False),
        ({"include_usage": 1}, False),  # vLLM's pydantic reads these as true
        ({"include_usage": "true"}, False),
        ({"include_usage": "yes"}, False),
        ({"include_usage": "maybe"}, False),  # vLLM rejects the body: sent as it is
        ({"include_usage": False}, True),
        ({"include_usage": 0}, True),
        ({}, True),
        (None, True),
    ],
)
def test_usage_is_forced_only_when_the_client_did_not_ask(options: object, forced: bool) -> None:
    body = STREAM | {"stream_options": options}
    out = with_usage(json.dumps(body).encode(), body)
    assert (out is not None) == forced
    if out is not None:
        assert json.loads(out)["stream_options"]["include_usage"] is True


def test_forced_body_keeps_a_lone_surrogate_encodable() -> None:
    raw = b'{"model":"m","prompt":"\\ud800","stream":true,"stream_options":null}'
    out = with_usage(raw, json.loads(raw))
    assert out is not None and json.loads(out)["prompt"] == "\ud800"


def test_non_utf8_json_is_left_alone() -> None:
    body = STREAM
    assert with_usage(json.dumps(body).encode("utf-16"), body) is None
    assert with_usage(b"\xef\xbb\xbf" + json.dumps(body).encode(), body) is None


async def test_lone_surrogate_stream_with_options_is_served(gw: InProcess) -> None:
    raw = (
        b'{"model":"' + MODEL.encode() + b'","prompt":"\\ud800","stream":true,'
        b'"stream_options":{"include_usage":false}}'
    )
    resp = await gw.client.post("/v1/completions", content=raw)
    assert resp.status_code == 200
    assert resp.text.rstrip().endswith("data: [DONE]")


async def test_backend_status_outside_200_599_fails_over(gw: InProcess) -> None:
    for fake in gw.fakes.values():
        fake.status = 999
    resp = await gw.client.post("/v1/completions", json=STREAM | {"stream": False})
    assert resp.status_code == 503
    assert resp.json()["error"]["code"] == "no_healthy_backend"


async def test_the_first_of_repeated_headers_counts(gw: InProcess) -> None:
    headers = [("x-request-id", "first"), ("x-request-id", "second")]
    resp = await gw.client.post("/v1/completions", json=STREAM | {"stream": False}, headers=headers)
    assert resp.headers["x-request-id"] == "first"


async def test_a_failing_observer_does_not_leak_the_in_flight_slot(gw: InProcess) -> None:
    gateway = gw.app.state.runtime.gateway

    def broken(_trace: RequestTrace) -> None:
        raise OverflowError("observer bug")

    gateway.observers.insert(0, broken)
    resp = await gw.client.post("/v1/completions", json=STREAM | {"stream": False})
    assert resp.status_code == 200
    assert gateway.inflight == 0


def test_overflowing_usage_reads_as_no_usage() -> None:
    trace = RequestTrace("r", "completions", stream=False)
    trace.on_chunk(b'{"usage":{"completion_tokens":1e999}}')
    trace.finish(200)
    assert trace.completion_tokens() is None


async def test_an_upstream_closed_before_relaying_releases_its_backend() -> None:
    """A response whose body is never iterated (the client's send failed first) still
    gives back the backend's in-flight count and closes the upstream response."""
    closed: list[bool] = []

    class Body(httpx.AsyncByteStream):
        async def __aiter__(self):  # type: ignore[no-untyped-def]
            yield b"data: x\n\n"

        async def aclose(self) -> None:
            closed.append(True)

    transport = httpx.MockTransport(lambda _request: httpx.Response(200, stream=Body()))
    config = local_config()
    registry = BackendRegistry(config.backends)
    trace = RequestTrace("r", "completions", stream=True)
    async with httpx.AsyncClient(transport=transport) as client:
        forwarder = Forwarder(
            HttpxUpstream(client), 1, 5.0, 5.0, stream_failure=stream_failure_event
        )
        backends: dict[str, BackendConfig] = dict(config.backends)
        upstream = await forwarder.open(
            backends, registry.states, ("plain",), path="/v1/completions", body=b"{}",
            headers={}, trace=trace,
        )  # fmt: skip
        assert registry.states["plain"].inflight == 1
        await upstream.body.aclose()
    assert registry.states["plain"].inflight == 0
    assert closed == [True] and trace.status == 499


async def test_a_non_ascii_key_is_read_alike_on_every_endpoint() -> None:
    config = local_config()
    fakes = {name: FakeBehaviour(name=name) for name in config.backends}
    apps = {
        b.base_url.removeprefix("http://"): create_fake_vllm(fakes[name])
        for name, b in config.backends.items()
    }
    settings = Settings(health_interval_s=60, api_keys="cl\u00e9")
    app = create_app(settings, config=config, transport=BackendsTransport(apps))
    key = {"authorization": "Bearer cl\u00e9".encode()}  # UTF-8 on the wire
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            models = await client.get("/v1/models", headers=key)
            done = await client.post(
                "/v1/completions", json=STREAM | {"stream": False}, headers=key
            )
            wrong = await client.get("/v1/models", headers={"authorization": "Bearer cle"})
    assert models.status_code == 200 and done.status_code == 200
    assert wrong.status_code == 401
