"""A backend found down (``/health`` refused or not 200) while requests wait there: a
request with nothing of its answer yet moves on to the next backend at once, instead of
waiting for the first-byte timeout; a stream already answering ends at once, and is never
sent elsewhere. A backend down only because its probes were slow keeps its requests. A
non-streamed answer that breaks off part-way moves on too, once: the client had nothing.

Real sockets, on each upstream engine (aiohttp, httpx), the gateway's own health poller
marking the fake vLLM server down. In process: the guard's cancellation rules and
containment's priority over the failover.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest

from contracts.config import parse_config
from gateway.app import create_app
from gateway.settings import Settings
from gateway.upstream.attempt import Attempt, MarkedDown
from gateway.upstream.state import BackendState
from tests.fakes.fake_vllm import FakeBehaviour, create_fake_vllm
from tests.fakes.servers import running_server
from tests.unit.conftest import MODEL, InProcess

BODY = {"model": MODEL, "prompt": "x", "max_tokens": 8}
#: The first-byte and idle timeouts: what the old code waited for.
PATIENCE_S = 10.0
#: Well under PATIENCE_S: two slow health rounds (0.2 s interval + 0.2 s timeout each), the
#: death probe (0.2 s), and a loaded machine's slack.
PROMPT_S = 5.0


@dataclass
class Stack:
    url: str
    fakes: dict[str, FakeBehaviour]


@pytest.fixture(params=["aiohttp", "httpx"])
def stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    """``a`` first (its pool), ``b`` its fallback, static order; a health poll every 0.2 s
    that marks a backend sending nothing down after two slow probes."""
    settings = Settings(
        health_interval_s=0.2,
        health_timeout_s=0.2,
        health_failures=2,
        death_probe_timeout_s=0.2,
        first_byte_timeout_s=PATIENCE_S,
        idle_timeout_s=PATIENCE_S,
        upstream_transport=request.param,
        state_persist=False,
    )
    fakes = {"a": FakeBehaviour(name="a"), "b": FakeBehaviour(name="b")}
    with (
        running_server(create_fake_vllm(fakes["a"]), timeout_graceful_shutdown=1) as a_url,
        running_server(create_fake_vllm(fakes["b"])) as b_url,
    ):
        config = parse_config(
            {
                "defaults": {"pool": "first"},
                "routing": {"policy": "static"},
                "backends": {
                    "a": {"url": a_url, "model": MODEL},
                    "b": {"url": b_url, "model": MODEL},
                },
                "pools": {"first": ["a"], "second": ["b"]},
                "rules": [{"name": "all", "match": {}, "pool": "first", "fallbacks": ["second"]}],
            }
        )
        with running_server(create_app(settings, config=config)) as url:
            yield Stack(url, fakes)


def stop(fake: FakeBehaviour, *, after_chunks: int | None = None) -> None:
    """The fake answers nothing from now on, ``/health`` included (``after_chunks``: a
    stream's chunks it still sends first)."""
    fake.health_delay_s = 3600.0
    if after_chunks is None:
        fake.first_delay_s = 3600.0
    else:
        fake.hang_after = after_chunks


def test_a_backend_only_slow_to_probe_keeps_its_requests(stack: Stack) -> None:
    """Marked down for slow probes alone (a busy server's ``/health`` can be): a request
    waiting there is not given up (its work would be thrown away and done again on the
    next backend); it gets its answer from ``a`` when ``a`` has it."""
    stack.fakes["a"].health_delay_s = 3600.0  # every probe times out
    # marked down while the request waits: two slow rounds (0.4 s each) and a loaded
    # machine's slack (a 2 s wait here failed once beside a bundle build and the unit suite)
    stack.fakes["a"].first_delay_s = PROMPT_S
    with ThreadPoolExecutor(1) as pool:
        sent = pool.submit(
            httpx.post, f"{stack.url}/v1/completions", json=BODY, timeout=3 * PATIENCE_S
        )
        # read while it waits: once answered, a is alive again by its answer (the poller
        # counts a slow probe right after one as up), so a read after it races the poller
        assert _down_while_waiting(stack.url, "a", sent), "a was not marked down in time"
        resp = sent.result()
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-specgate-backend"] == "a"
    assert [len(f.received) for f in stack.fakes.values()] == [1, 0]


def _down_while_waiting(url: str, name: str, sent: Future[httpx.Response]) -> bool:
    """Whether the gateway at ``url`` shows backend ``name`` unhealthy before ``sent`` is
    answered (``/routes``, read every 50 ms)."""
    while not sent.done():
        routes = httpx.get(f"{url}/routes").json()
        if next(v for v in routes["backends"] if v["name"] == name)["healthy"] is False:
            return not sent.done()
        time.sleep(0.05)
    return False


async def _post_both(url: str, body: dict[str, object]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=3 * PATIENCE_S) as client:
        return list(
            await asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(2)))
        )


def test_requests_waiting_on_a_backend_found_down_move_on(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """Its ``/health`` answers 503 while two requests wait there for an answer that never
    comes (the engine gone, the API server up): both move on at once, not after the
    first-byte timeout (a death with two in flight blames nobody: each moves on once)."""
    caplog.set_level(logging.INFO, logger="specgate.access")
    stack.fakes["a"].first_delay_s = 3600.0
    started = time.monotonic()
    sending = asyncio.new_event_loop()
    try:
        task = sending.create_task(_post_both(stack.url, BODY))
        sending.run_until_complete(asyncio.sleep(0.3))
        assert len(stack.fakes["a"].received) == 2  # both waiting there
        stack.fakes["a"].healthy = False
        answers = sending.run_until_complete(task)
    finally:
        sending.close()
    elapsed = time.monotonic() - started
    for resp in answers:
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-specgate-backend"] == "b"
    assert elapsed < PROMPT_S, f"answered after {elapsed:.1f} s"
    assert [len(f.received) for f in stack.fakes.values()] == [2, 2]
    lines = [r.getMessage() for r in caplog.records if r.name == "specgate.access"]
    assert sum("backend=b attempts=2 status=200" in line for line in lines) == 2


def test_a_stream_that_sent_chunks_is_ended_not_sent_again(stack: Stack) -> None:
    """A stream that reached the client is never sent elsewhere: its backend found down
    (``/health`` 503) while it waits for the next chunk, it ends with an error event (after
    the idle timeout: a relayed chunk's wait is not given up, a dead engine ends its own
    streams)."""
    stop(stack.fakes["a"], after_chunks=2)
    stack.fakes["a"].health_delay_s = 0.0
    with httpx.stream(
        "POST",
        f"{stack.url}/v1/completions",
        json=BODY | {"stream": True},
        timeout=3 * PATIENCE_S,
    ) as resp:
        lines = resp.iter_lines()
        events = [next(lines), next(lines)]  # the two chunks a sent
        stack.fakes["a"].healthy = False
        events += [line for line in lines if line]
    assert resp.status_code == 200 and resp.headers["x-specgate-backend"] == "a"
    events = [e for e in events if e]
    assert [e for e in events if '"text"' in e] == events[:2]  # each chunk once, a's only
    assert len(events) == 4, events
    assert '"error"' in events[2] and events[3] == "data: [DONE]"
    assert len(stack.fakes["b"].received) == 0  # never sent to another backend


def test_a_non_streamed_answer_cut_after_its_headers_moves_on(stack: Stack) -> None:
    stack.fakes["a"].die_after = 3  # headers and 3 chunks of the body, then the reset
    resp = httpx.post(f"{stack.url}/v1/completions", json=BODY, timeout=3 * PATIENCE_S)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-specgate-backend"] == "b" and resp.json()["served_by"] == "b"
    assert [len(f.received) for f in stack.fakes.values()] == [1, 1]
    routes = httpx.get(f"{stack.url}/routes").json()
    assert routes["decisions"]["failovers"] == 1
    assert all(view["inflight"] == 0 for view in routes["backends"])


def test_answers_cut_on_every_backend_move_on_once_then_502(stack: Stack) -> None:
    """A request whose answers keep breaking is not sent round every backend: once."""
    for fake in stack.fakes.values():
        fake.die_after = 3
    resp = httpx.post(f"{stack.url}/v1/completions", json=BODY, timeout=3 * PATIENCE_S)
    assert resp.status_code == 502 and resp.json()["error"]["code"] == "upstream_error"
    assert [len(f.received) for f in stack.fakes.values()] == [1, 1]


async def test_the_guard_turns_only_its_own_cancellation_into_marked_down() -> None:
    """Marked down inside the block: :class:`MarkedDown`; cancelled from outside (the client
    left), even as the backend goes down too: ``CancelledError``; after the block: nothing."""
    state = BackendState(healthy=True)
    attempt = Attempt("a", "http://a", state, None)

    async def wait() -> None:
        with attempt.given_up_when_down():
            await asyncio.sleep(3600)

    waiting = asyncio.ensure_future(wait())
    await asyncio.sleep(0)
    state.mark(False)
    with pytest.raises(MarkedDown, match="marked down"):
        await waiting
    assert not state.down_listeners

    state.mark(True)
    waiting = asyncio.ensure_future(wait())
    await asyncio.sleep(0)
    waiting.cancel()  # the client left ...
    state.mark(False)  # ... as the backend went down
    with pytest.raises(asyncio.CancelledError):
        await waiting

    state.mark(True)
    with attempt.given_up_when_down():
        await asyncio.sleep(0)
    state.mark(False)  # the wait is over: nothing to cancel
    await asyncio.sleep(0.01)
    assert not state.down_listeners


async def test_a_backend_found_dead_under_a_waiting_request_is_still_a_death(
    gw: InProcess,
) -> None:
    """Containment first: a backend marked down because ``/health`` fails (the process or
    its engine gone) ends the lone request waiting there as a death's suspect (500, not
    retried), as the backend's own error answer would have, only at once."""
    plain = gw.fakes["plain"]
    plain.first_delay_s = 3600.0
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story."}]}
    waiting = asyncio.ensure_future(gw.client.post("/v1/chat/completions", json=chat))
    await asyncio.sleep(0.1)
    assert len(plain.received) == 1  # waiting there
    plain.healthy = False
    await gw.poll()
    resp = await asyncio.wait_for(waiting, timeout=PROMPT_S)
    error = resp.json()["error"]
    assert resp.status_code == 500 and error["code"] == "backend_died", resp.text
    assert "only a suspect" in error["message"]
    assert sum(len(f.received) for f in gw.fakes.values()) == 1
