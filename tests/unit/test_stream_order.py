"""Nothing the gateway adds holds a stream back (issue 26, item 6).

The bug: a completions stream of two prompts whose first choice finished at once arrived in
one burst at the end (first byte after 6.9 s instead of 0.15 s): the gateway held every line
from the first terminal chunk until the usage chunk it had asked for, to move the
``system_fingerprint`` back. Here the fake backend sends its next chunk only once the test
has received the previous one from the gateway (real sockets: ASGITransport buffers), so a
held chunk shows as a chunk not released, without any timing threshold.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from contracts.config import parse_config
from gateway.app import create_app
from gateway.settings import Settings
from gateway.trace import RequestTrace
from gateway.upstream.feedback import ResponseTap
from gateway.upstream.state import BackendRegistry
from tests.fakes.servers import running_server

MODEL = "smollm2-135m-instruct"
FP = "vllm-0.32.0-daf89570"
#: Gate timeout: only breaks a deadlock (a held chunk); never reached when the relay is live.
GATE_S = 10.0


def _event(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def events(usage: bool) -> list[bytes]:
    """vLLM's stream of two prompts (n=1): choice 0 finishes at once, choice 1 runs on; the
    fingerprint is on each terminal chunk, or on the usage chunk when usage is on."""

    def chunk(index: int, text: str, finish: str | None) -> bytes:
        choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish}
        data: dict[str, Any] = {"id": "cmpl-1", "object": "text_completion", "created": 0,
                                "model": MODEL, "choices": [choice]}  # fmt: skip
        if finish is not None and not usage:
            data["system_fingerprint"] = FP
        return _event(data)

    out = [chunk(0, "a", "stop"), chunk(1, "b", None), chunk(1, "c", None)]
    out.append(chunk(1, "d", "length"))
    if usage:
        counts = {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8}
        out.append(_event({"id": "cmpl-1", "object": "text_completion", "created": 0,
                           "model": MODEL, "choices": [], "usage": counts,
                           "system_fingerprint": FP}))  # fmt: skip
    return out


@dataclass
class GatedBackend:
    """A fake vLLM whose stream sends event k+1 only after ``received(k)``."""

    bodies: list[dict[str, Any]] = field(default_factory=list)
    gates: list[threading.Event] = field(default_factory=list)
    held: list[int] = field(default_factory=list)  # events sent after a gate timed out

    def received(self, k: int) -> None:
        self.gates[k].set()

    def app(self) -> Starlette:
        async def completions(request: Request) -> Response:
            body = await request.json()
            self.bodies.append(body)
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            out = events(usage)
            self.gates = [threading.Event() for _ in out]
            content = [e for e in out if b'"usage"' not in e]

            async def stream() -> AsyncIterator[bytes]:
                for k, event in enumerate(out):
                    if k and out[k - 1] in content:  # the client can see the previous one
                        if not await asyncio.to_thread(self.gates[k - 1].wait, GATE_S):
                            self.held.append(k - 1)
                    yield event
                yield b"data: [DONE]\n\n"

            return StreamingResponse(stream(), media_type="text/event-stream")

        async def health(_: Request) -> Response:
            return Response()

        return Starlette(
            routes=[
                Route("/v1/completions", completions, methods=["POST"]),
                Route("/health", health),
            ]
        )


@contextmanager
def gateway_before(backend: Starlette) -> Iterator[str]:
    """A real gateway (its URL) whose one backend, ``plain``, is ``backend`` on a socket."""
    with running_server(backend) as backend_url:
        config = parse_config(
            {
                "defaults": {"pool": "p"},
                "backends": {"plain": {"url": backend_url, "model": MODEL}},
                "pools": {"p": ["plain"]},
            }
        )
        app = create_app(Settings(health_interval_s=60, state_persist=False), config=config)
        with running_server(app) as url:
            yield url


@pytest.fixture
def gated() -> Iterator[tuple[str, GatedBackend]]:
    backend = GatedBackend()
    with gateway_before(backend.app()) as url:
        yield url, backend


async def read_gated(url: str, backend: GatedBackend) -> bytes:
    """Stream two prompts through the gateway, releasing each next event on receipt."""
    body = {"model": MODEL, "prompt": ["x", "y"], "max_tokens": 4, "stream": True}
    seen = 0
    raw = b""
    async with (
        httpx.AsyncClient(base_url=url, timeout=30) as client,
        client.stream("POST", "/v1/completions", json=body) as resp,
    ):
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            raw += line.encode() + b"\n"
            if line.startswith("data: {"):
                backend.received(seen)
                seen += 1
    return raw


async def test_every_chunk_goes_out_when_it_arrives(gated: tuple[str, GatedBackend]) -> None:
    url, backend = gated
    expected = b"".join(events(usage=False)) + b"data: [DONE]\n\n"
    first = await read_gated(url, backend)  # teaches the backend's fingerprint
    assert "stream_options" not in backend.bodies[0]
    second = await read_gated(url, backend)  # the gateway asks for (and strips) usage
    assert backend.bodies[1]["stream_options"]["include_usage"] is True
    assert backend.held == []  # no event waited for the client to see a later one
    assert first == second == expected  # exactly a server not asked for usage


def test_tap_passes_each_line_in_the_read_that_completes_it() -> None:
    registry = BackendRegistry(["plain"])
    registry.states["plain"].fingerprint = json.dumps(FP).encode()
    trace = RequestTrace("r", "completions", stream=True)
    trace.backend = "plain"
    tap = ResponseTap(trace, strip=True, registry=registry)
    reads = events(usage=True) + [b"data: [DONE]\n\n"]
    out = [tap.feed(r) for r in reads]
    wanted = events(usage=False)
    assert out[:4] == wanted  # each terminal chunk stamped as it passes, none held
    assert out[4] == b""  # the usage chunk the gateway asked for
    assert out[5] == b"data: [DONE]\n\n" and tap.close() == b""
    assert trace.completion_tokens() == 4


async def test_a_client_leaving_after_done_was_served_not_499() -> None:
    """The OpenAI SDK closes its connection once it has read ``data: [DONE]``, often before
    vLLM ends the HTTP stream: that request was served (200), not a client that left (499,
    which the adaptive learner ignores). Here the fake keeps its stream open after [DONE]
    until the client has gone."""
    client_gone = threading.Event()

    async def completions(_: Request) -> Response:
        async def stream() -> AsyncIterator[bytes]:
            yield b"".join(events(usage=False)) + b"data: [DONE]\n\n"
            await asyncio.to_thread(client_gone.wait, GATE_S)  # still open after [DONE]

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def health(_: Request) -> Response:
        return Response()

    backend = Starlette(
        routes=[Route("/v1/completions", completions, methods=["POST"]), Route("/health", health)]
    )
    body = {"model": MODEL, "prompt": ["x", "y"], "max_tokens": 4, "stream": True}
    with gateway_before(backend) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            async with client.stream("POST", "/v1/completions", json=body) as resp:
                async for line in resp.aiter_lines():
                    if line == "data: [DONE]":
                        break  # and leave, as the SDK does
            await asyncio.sleep(0.5)  # the gateway sees the disconnect
            client_gone.set()
            await asyncio.sleep(0.2)
            metrics = (await client.get("/metrics")).text
    served = [ln for ln in metrics.splitlines() if ln.startswith("specgate_requests_total{")]
    assert any('status="200"' in ln for ln in served), served
    assert not any('status="499"' in ln for ln in served), served
