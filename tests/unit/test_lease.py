"""The backend lease (an :class:`~gateway.upstream.attempt.Attempt`): its in-flight slot
and its upstream response are given back on every way out of a try, cancellation
included (issue 14, item 1). Leak paths found in the forwarder, each pinned here:
a client leaving while the gateway reads a 5xx answer's head, or while the death watch
probes a backend that dropped the connection."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

import httpx

from contracts.config import BackendConfig
from gateway.errors import stream_failure_event
from gateway.trace import RequestTrace
from gateway.upstream.attempt import Attempt
from gateway.upstream.client import UpstreamDropped
from gateway.upstream.deaths import DeathWatch
from gateway.upstream.forward import Forwarder
from gateway.upstream.quarantine import QuarantineTable
from gateway.upstream.state import BackendRegistry, BackendState
from tests.unit.conftest import MODEL

URL = "http://127.0.0.1:8001"
BACKENDS = {"plain": BackendConfig(url=URL, model=MODEL)}


@dataclass
class StalledResponse:
    """A 500 answer whose body never comes."""

    status: int = 500
    raw_headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    closed: int = 0

    async def chunks(self) -> AsyncIterator[bytes]:
        await asyncio.Event().wait()
        yield b""

    async def aclose(self) -> None:
        self.closed += 1


@dataclass
class Upstream:
    """An upstream client answering every post with ``response``, or raising ``error``."""

    response: StalledResponse | None = None
    error: Exception | None = None

    async def post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        method: str = "POST",
        first_byte_timeout_s: float,
        idle_timeout_s: float,
    ) -> StalledResponse:
        if self.error is not None:
            raise self.error
        assert self.response is not None
        return self.response

    async def aclose(self) -> None:
        pass


async def cancel_mid_open(forwarder: Forwarder, registry: BackendRegistry) -> None:
    """Open a request, let it reach its first wait, then cancel it (the client left)."""
    trace = RequestTrace("r", "completions", stream=False)
    task = asyncio.ensure_future(
        forwarder.open(
            BACKENDS,
            registry.states,
            ("plain",),
            path="/v1/completions",
            body=b"{}",
            headers={},
            trace=trace,
            request={"prompt": "x"},
        )
    )
    for _ in range(5):
        await asyncio.sleep(0)
    assert not task.done()
    assert registry.states["plain"].inflight == 1
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_cancelled_while_reading_a_5xx_head_gives_the_lease_back() -> None:
    registry = BackendRegistry(BACKENDS)
    response = StalledResponse()
    forwarder = Forwarder(
        Upstream(response=response),
        max_attempts=1,
        first_byte_timeout_s=5,
        idle_timeout_s=5,
        stream_failure=stream_failure_event,
    )
    await cancel_mid_open(forwarder, registry)
    state = registry.states["plain"]
    assert state.inflight == 0 and response.closed >= 1
    assert state.circuit.probing is False


async def test_cancelled_while_probing_a_dropped_backend_gives_the_lease_back() -> None:
    async def hang(_request: httpx.Request) -> httpx.Response:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    registry = BackendRegistry(BACKENDS)
    async with httpx.AsyncClient(transport=httpx.MockTransport(hang)) as client:
        table = QuarantineTable(ttl_s=60, max_entries=10, strikes=2)
        watch = DeathWatch(client, registry, table, probe_timeout_s=60)
        forwarder = Forwarder(
            Upstream(error=UpstreamDropped("reset")),
            max_attempts=1,
            first_byte_timeout_s=5,
            idle_timeout_s=5,
            watch=watch,
            stream_failure=stream_failure_event,
        )
        await cancel_mid_open(forwarder, registry)
    assert registry.states["plain"].inflight == 0
    assert watch._inflight.get("plain", {}) == {}


def test_ending_a_lease_twice_gives_one_slot_back() -> None:
    state = BackendState()
    attempt = Attempt("plain", URL, state, None)
    attempt.begin("/v1/completions", None)
    assert state.inflight == 1 and attempt.held
    attempt.end()
    attempt.end()
    assert state.inflight == 0 and not attempt.held
