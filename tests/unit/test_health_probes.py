"""Backend health under load (issue 26, item 1): a slow probe is load, not death.

The bug: one ``/health`` probe slower than 1 s marked a backend down; during a burst two
backends were down together for 2 s and a request whose rule had no other pool got 503.
"""

from __future__ import annotations

import time

import httpx
import pytest

from contracts.config import parse_config
from gateway.upstream.health import HealthPoller, probe_verdict
from gateway.upstream.state import BackendRegistry, Backends
from tests.unit.conftest import MODEL, InProcess

CONFIG = parse_config(
    {
        "defaults": {"pool": "p"},
        "backends": {"b": {"url": "http://b:1", "model": "m"}},
        "pools": {"p": ["b"]},
    }
)


class Probe:
    """A backend's ``/health`` and ``/metrics`` as a mock transport: ``mode`` is ``ok``,
    ``slow`` (read timeout), ``reset`` (connection broken mid-answer), ``refused`` or an
    HTTP status."""

    def __init__(self) -> None:
        self.mode: str | int = "ok"

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.mode == "slow":
            raise httpx.ReadTimeout("timed out", request=request)
        if self.mode == "reset":
            raise httpx.RemoteProtocolError("peer closed", request=request)
        if self.mode == "refused":
            raise httpx.ConnectError("connection refused", request=request)
        status = 200 if self.mode == "ok" else int(self.mode)
        return httpx.Response(status, text="")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def probe() -> Probe:
    return Probe()


def poller(probe: Probe, clock: Clock) -> HealthPoller:
    client = httpx.AsyncClient(transport=httpx.MockTransport(probe))
    registry = BackendRegistry(CONFIG.backends)
    backends = Backends(client, lambda: CONFIG, registry)
    return HealthPoller(backends, interval_s=2.0, timeout_s=5.0, failures=3, clock=clock)


async def rounds(p: HealthPoller, clock: Clock, n: int) -> list[bool | None]:
    """``n`` probe rounds 7 s apart (interval + timeout); each round's verdict."""
    seen = []
    for _ in range(n):
        clock.now += 7.0
        await p.check_all()
        seen.append(p.registry.states["b"].healthy)
    return seen


@pytest.mark.parametrize(
    ("result", "verdict"),
    [
        (httpx.Response(200), "up"),
        (httpx.Response(503), "down"),
        (httpx.ConnectError("refused"), "down"),
        (httpx.ReadTimeout("slow"), "slow"),
        (httpx.ConnectTimeout("syn backlog full"), "slow"),
        (httpx.RemoteProtocolError("reset"), "slow"),
    ],
)
def test_probe_verdicts(result: httpx.Response | Exception, verdict: str) -> None:
    assert probe_verdict(result) == verdict


@pytest.mark.parametrize("mode", ["slow", "reset"])
async def test_slow_probes_need_three_in_a_row(probe: Probe, mode: str) -> None:
    clock = Clock()
    p = poller(probe, clock)
    assert await rounds(p, clock, 1) == [True]
    probe.mode = mode
    assert await rounds(p, clock, 2) == [True, True]  # load, not death
    probe.mode = "ok"
    assert await rounds(p, clock, 1) == [True]  # the count starts again
    probe.mode = mode
    assert await rounds(p, clock, 3) == [True, True, False]
    assert p.registry.states["b"].last_error is not None
    assert await rounds(p, clock, 1) == [False]  # a slow probe never brings it back
    probe.mode = "ok"
    assert await rounds(p, clock, 1) == [True]  # one passing probe does


async def test_a_backend_sending_bytes_is_alive_however_slow_its_probe(probe: Probe) -> None:
    clock = Clock()
    p = poller(probe, clock)
    await rounds(p, clock, 1)
    probe.mode = "slow"
    state = p.registry.states["b"]
    for _ in range(10):
        clock.now += 7.0
        state.alive_at = clock.now - 3.0  # a stream chunk during the probe
        await p.check_all()
        assert state.healthy is True and state.probe_failures == 0
    clock.now += 7.0
    state.alive_at = clock.now - 7.5  # silent since the previous round: counts
    await p.check_all()
    assert state.probe_failures == 1


@pytest.mark.parametrize("mode", ["refused", 503, 500])
async def test_refused_or_unhealthy_answer_is_down_at_once(probe: Probe, mode: str | int) -> None:
    clock = Clock()
    p = poller(probe, clock)
    await rounds(p, clock, 1)
    probe.mode = mode
    state = p.registry.states["b"]
    state.alive_at = clock.now + 7.0  # even while bytes were flowing: the process is gone
    assert await rounds(p, clock, 1) == [False]


async def test_a_first_probe_that_times_out_is_down_not_unknown(probe: Probe) -> None:
    clock = Clock()
    p = poller(probe, clock)
    probe.mode = "slow"
    assert await rounds(p, clock, 1) == [False]


async def test_answers_and_stream_chunks_mark_a_backend_alive(gw: InProcess) -> None:
    state = gw.app.state.runtime.gateway.registry.states["plain"]
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 4, "temperature": 1.0}
    before = time.monotonic()
    resp = await gw.client.post("/v1/completions", json=body | {"stream": True})
    assert resp.status_code == 200 and resp.headers["x-specgate-backend"] == "plain"
    assert state.alive_at >= before
