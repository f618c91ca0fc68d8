"""Fault injection on real sockets: circuit breaker, timeouts, backpressure, client
disconnects. The backends are in-process fakes; real vLLM cancellation is in integration."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from contracts.config import parse_config
from gateway.app import create_app
from gateway.settings import Settings
from tests.fakes.fake_vllm import FakeBehaviour, create_fake_vllm
from tests.fakes.servers import running_server

MODEL = "smollm2-135m-instruct"
BODY = {"model": MODEL, "prompt": "x", "max_tokens": 8}


@dataclass
class Stack:
    url: str
    fakes: dict[str, FakeBehaviour]


def make_stack(settings: Settings, **backend_extra: Any) -> Iterator[Stack]:
    fakes = {"a": FakeBehaviour(name="a"), "b": FakeBehaviour(name="b")}
    with (
        running_server(create_fake_vllm(fakes["a"])) as a_url,
        running_server(create_fake_vllm(fakes["b"])) as b_url,
    ):
        backends = {
            "a": {"url": a_url, "model": MODEL, **backend_extra},
            "b": {"url": b_url, "model": MODEL, **backend_extra},
        }
        config = parse_config(
            {"defaults": {"pool": "p"}, "backends": backends, "pools": {"p": ["a", "b"]}}
        )
        with running_server(create_app(settings, config=config)) as url:
            yield Stack(url, fakes)


@pytest.fixture(params=["aiohttp", "httpx"])
def stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    """Fakes behind a gateway on real sockets, on each upstream engine (the timeouts are
    implemented differently on each)."""
    settings = Settings(
        health_interval_s=60,
        circuit_failures=2,
        circuit_cooldown_s=0.5,
        first_byte_timeout_s=1.0,
        idle_timeout_s=0.3,
        upstream_transport=request.param,
    )
    yield from make_stack(settings)


def routes(stack: Stack) -> dict[str, dict[str, Any]]:
    return {b["name"]: b for b in httpx.get(f"{stack.url}/routes").json()["backends"]}


@pytest.fixture
def slow_cooling() -> Iterator[Stack]:
    """A circuit cool-down long enough (3 s) that a loaded machine cannot end it early."""
    yield from make_stack(Settings(health_interval_s=60, circuit_failures=2, circuit_cooldown_s=3))


def test_circuit_opens_after_failures_then_probe_closes_it(slow_cooling: Stack) -> None:
    stack = slow_cooling
    stack.fakes["a"].status = 503
    # a and b tie on load, so each request picks one at random (then fails over from a)
    served = []
    while len(stack.fakes["a"].received) < 2 and len(served) < 40:
        served.append(httpx.post(f"{stack.url}/v1/completions", json=BODY).json()["served_by"])
    served += [
        httpx.post(f"{stack.url}/v1/completions", json=BODY).json()["served_by"] for _ in range(6)
    ]
    assert set(served) == {"b"}  # every request failed over from a, or skipped it
    assert len(stack.fakes["a"].received) == 2  # two failures opened the circuit: a skipped
    view = routes(stack)["a"]
    assert view["circuit"] == {"state": "open", "consecutive_failures": 2, "opened": 1}
    stack.fakes["a"].status = 200
    time.sleep(3.1)  # cool-down over: half-open, the next request routed to a probes it
    assert routes(stack)["a"]["circuit"]["state"] == "half_open"
    # at most 40 tries (a staying unpicked has probability 2**-40)
    for _ in range(40):
        if httpx.post(f"{stack.url}/v1/completions", json=BODY).json()["served_by"] == "a":
            break
    assert routes(stack)["a"]["circuit"]["state"] == "closed"
    assert len(stack.fakes["a"].received) >= 3


def test_no_headers_within_first_byte_timeout_is_504(stack: Stack) -> None:
    for fake in stack.fakes.values():
        fake.first_delay_s = 1.5
    resp = httpx.post(f"{stack.url}/v1/completions", json=BODY, timeout=10)
    assert resp.status_code == 504
    assert resp.json()["error"]["code"] == "upstream_timeout"
    assert sum(len(f.received) for f in stack.fakes.values()) == 1  # not retried elsewhere


def test_stream_idle_longer_than_idle_timeout_ends_with_error(stack: Stack) -> None:
    for fake in stack.fakes.values():
        fake.delay_s = 0.6
    with httpx.stream(
        "POST", f"{stack.url}/v1/completions", json=BODY | {"stream": True}, timeout=10
    ) as resp:
        assert resp.status_code == 200
        events = [line for line in resp.iter_lines() if line]
    assert '"code": "upstream_error"' in events[-2]
    assert events[-1] == "data: [DONE]"


async def test_client_leaving_a_stream_closes_the_upstream(stack: Stack) -> None:
    for fake in stack.fakes.values():
        fake.delay_s = 0.1
        fake.tokens = 50
    async with httpx.AsyncClient(timeout=10) as client:
        async with client.stream(
            "POST", f"{stack.url}/v1/completions", json=BODY | {"stream": True}
        ) as resp:
            async for _ in resp.aiter_lines():
                break  # the client goes away after the first event
    await asyncio.sleep(0.5)
    assert sum(f.closed_early for f in stack.fakes.values()) == 1
    assert all(b["inflight"] == 0 for b in routes(stack).values())


async def test_client_leaving_a_non_streamed_request_closes_the_upstream(stack: Stack) -> None:
    for fake in stack.fakes.values():  # the fake sends nothing for 0.9 s (< first byte 1 s)
        fake.first_delay_s = 0.9
    async with httpx.AsyncClient(timeout=0.3) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post(f"{stack.url}/v1/completions", json=BODY)
        await asyncio.sleep(0.2)  # long before the fake would have answered
        views = (await client.get(f"{stack.url}/routes")).json()["backends"]
    assert all(b["inflight"] == 0 for b in views)


@pytest.fixture
def capped() -> Iterator[Stack]:
    yield from make_stack(Settings(health_interval_s=60, max_inflight=3), max_inflight=1)


async def test_backpressure_answers_429_with_retry_after(capped: Stack) -> None:
    for fake in capped.fakes.values():
        fake.delay_s = 0.2
    async with httpx.AsyncClient(timeout=10) as client:
        results = await asyncio.gather(
            *(
                client.post(f"{capped.url}/v1/completions", json=BODY | {"stream": True})
                for _ in range(6)
            )
        )
    statuses = sorted(r.status_code for r in results)
    assert statuses == [200, 200, 429, 429, 429, 429]
    rejected = [r for r in results if r.status_code == 429]
    assert all(r.headers["retry-after"] == "1" for r in rejected)
    assert all(r.json()["error"]["type"] == "rate_limit_error" for r in rejected)


def test_first_chunk_waits_for_the_first_byte_timeout_not_the_idle_one(stack: Stack) -> None:
    """vLLM sends a stream's headers at once and its first chunk after the prefill: that
    wait (0.6 s here) is bounded by the first-byte timeout (1 s), not the idle one (0.3 s)."""
    for fake in stack.fakes.values():
        fake.first_chunk_delay_s = 0.6
    with httpx.stream(
        "POST", f"{stack.url}/v1/completions", json=BODY | {"stream": True}, timeout=10
    ) as resp:
        events = [line for line in resp.iter_lines() if line]
    assert resp.status_code == 200
    assert events[-1] == "data: [DONE]" and "upstream_error" not in "".join(events)
    assert len(events) == 8 + 1  # every token chunk, then [DONE]


@pytest.fixture
def impatient() -> Iterator[Stack]:
    """One in-flight slot and a 0.5 s body timeout."""
    yield from make_stack(Settings(health_interval_s=60, max_inflight=1, body_timeout_s=0.5))


async def test_slow_body_is_408_and_holds_no_slot(impatient: Stack) -> None:
    host, port = impatient.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: 100\r\n\r\n{"
    )
    await writer.drain()
    async with httpx.AsyncClient(timeout=10) as client:  # the slow sender holds no slot
        resp = await client.post(f"{impatient.url}/v1/completions", json=BODY)
        assert resp.status_code == 200, resp.text
    answer = await asyncio.wait_for(reader.read(4096), timeout=5)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b'"code":"request_timeout"' in answer.replace(b" ", b"")
