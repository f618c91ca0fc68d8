"""The backend catalog (``/openapi.json`` and ``/v1/models`` per backend) with a backend that
hangs: one read in flight per backend however many requests ask, no wait for a backend
already answered, a failed backend asked again only after ``retry_s``."""

from __future__ import annotations

import asyncio
import logging
import time

import httpx
import pytest

from contracts.config import BackendConfig
from gateway.upstream.catalog import BackendCatalog
from gateway.upstream.state import BackendRegistry

BACKENDS = {
    "plain": BackendConfig(url="http://plain:8001", model="m"),
    "draft": BackendConfig(url="http://draft:8003", model="m"),
}
SCHEMA = {"paths": {"/v1/completions": {"post": {}}, "/tokenize": {"post": {}}}}
MODELS = {"object": "list", "data": [{"id": "m", "object": "model", "max_model_len": 2048}]}


class Backends:
    """Answers every backend's catalog reads; ``draft`` hangs while ``hang`` is set, or
    refuses the connection with ``refuse``; counts the reads per backend."""

    def __init__(self) -> None:
        self.hang = asyncio.Event()
        self.released = asyncio.Event()
        self.refuse = False
        self.reads: dict[str, int] = {}

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        self.reads[host] = self.reads.get(host, 0) + 1
        if host == "draft" and self.refuse:
            raise httpx.ConnectError("refused", request=request)
        if host == "draft" and self.hang.is_set():
            await self.released.wait()
        body = SCHEMA if request.url.path == "/openapi.json" else MODELS
        return httpx.Response(200, json=body)


async def test_a_hung_backend_is_read_once_and_delays_nobody_once_answered() -> None:
    backends, now = Backends(), [0.0]
    async with httpx.AsyncClient(transport=httpx.MockTransport(backends)) as client:
        catalog = BackendCatalog(client, ttl_s=60, retry_s=10, clock=lambda: now[0])
        await catalog.refresh(BACKENDS, BACKENDS)
        assert [t.template for t in catalog.paths("draft")] == ["/v1/completions", "/tokenize"]
        assert catalog.cards("draft") == MODELS["data"]
        assert backends.reads == {"plain": 2, "draft": 2}  # /openapi.json and /v1/models

        now[0] = 61.0  # both expired; draft hangs now
        backends.hang.set()
        started = time.monotonic()
        await asyncio.gather(*(catalog.refresh(BACKENDS, BACKENDS) for _ in range(6)))
        assert time.monotonic() - started < 0.5  # the last answer served meanwhile
        assert catalog.cards("draft") == MODELS["data"]
        await asyncio.sleep(0.05)
        assert backends.reads == {"plain": 4, "draft": 4}  # one re-read each, not six
        backends.released.set()
        await asyncio.sleep(0.05)
        await catalog.aclose()


async def test_concurrent_first_reads_share_one_read() -> None:
    """Before a backend's first answer every caller waits, for the same read (a lock made
    them wait one after another, a timeout each)."""
    backends = Backends()
    backends.hang.set()
    async with httpx.AsyncClient(transport=httpx.MockTransport(backends)) as client:
        catalog = BackendCatalog(client)
        waiting = [asyncio.ensure_future(catalog.refresh(BACKENDS, ["draft"])) for _ in range(6)]
        await asyncio.sleep(0.05)
        assert not any(w.done() for w in waiting)
        backends.released.set()
        await asyncio.wait_for(asyncio.gather(*waiting), timeout=1.0)
        assert backends.reads == {"draft": 2}
        assert catalog.cards("draft") == MODELS["data"]


async def test_a_failed_backend_keeps_its_answer_and_is_asked_again_after_retry_s() -> None:
    backends, now = Backends(), [0.0]
    async with httpx.AsyncClient(transport=httpx.MockTransport(backends)) as client:
        catalog = BackendCatalog(client, ttl_s=60, retry_s=10, clock=lambda: now[0])
        await catalog.refresh(BACKENDS, ["draft"])
        backends.refuse, now[0] = True, 61.0
        await catalog.refresh(BACKENDS, ["draft"])
        await asyncio.sleep(0.01)
        assert catalog.cards("draft") == MODELS["data"]  # kept
        reads = backends.reads["draft"]
        now[0] = 65.0
        await catalog.refresh(BACKENDS, ["draft"])  # within retry_s: not asked
        await asyncio.sleep(0.01)
        assert backends.reads["draft"] == reads
        now[0] = 72.0
        await catalog.refresh(BACKENDS, ["draft"])
        await asyncio.sleep(0.01)
        assert backends.reads["draft"] > reads


async def test_close_cancels_the_reads_in_flight() -> None:
    backends = Backends()
    backends.hang.set()
    async with httpx.AsyncClient(transport=httpx.MockTransport(backends)) as client:
        catalog = BackendCatalog(client)
        waiting = asyncio.ensure_future(catalog.refresh(BACKENDS, ["draft"]))
        await asyncio.sleep(0.05)
        await catalog.aclose()
        with pytest.raises(asyncio.CancelledError):  # the read it waited for is gone
            await asyncio.wait_for(waiting, timeout=1.0)


async def test_a_path_nobody_listed_waits_for_the_re_reads_in_flight() -> None:
    """``wait``: for a path no backend listed, the caller waits for the re-read (the backend
    may list it since it restarted), sharing it with every other caller."""
    backends, now = Backends(), [0.0]
    async with httpx.AsyncClient(transport=httpx.MockTransport(backends)) as client:
        catalog = BackendCatalog(client, ttl_s=60, clock=lambda: now[0])
        await catalog.refresh(BACKENDS, ["draft"])
        now[0] = 61.0
        backends.hang.set()
        await catalog.refresh(BACKENDS, ["draft"])  # answered: no wait, the re-read starts
        waiting = asyncio.ensure_future(catalog.refresh(BACKENDS, ["draft"], wait=True))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        backends.released.set()
        await asyncio.wait_for(waiting, timeout=1.0)
        assert backends.reads == {"draft": 4}


async def test_a_backend_whose_first_read_failed_delays_nobody_after() -> None:
    """A backend refusing its first read has no answer, and later callers do not wait for
    its retries (the real stack's SIGSTOPped draft server before its first answer: every
    /v1/models waited 5 s at each retry)."""
    backends, now = Backends(), [0.0]
    backends.refuse = True
    async with httpx.AsyncClient(transport=httpx.MockTransport(backends)) as client:
        catalog = BackendCatalog(client, ttl_s=60, retry_s=10, clock=lambda: now[0])
        await catalog.refresh(BACKENDS, BACKENDS)
        assert catalog.cards("plain") == MODELS["data"] and catalog.cards("draft") == []
        backends.refuse, now[0] = False, 11.0
        backends.hang.set()  # draft's retry hangs: nobody waits for it
        await asyncio.wait_for(catalog.refresh(BACKENDS, BACKENDS), timeout=0.5)
        assert catalog.cards("draft") == []
        backends.released.set()
        await asyncio.sleep(0.05)
        assert catalog.cards("draft") == MODELS["data"]
        await catalog.aclose()


@pytest.mark.parametrize(
    ("answer", "reached"),
    [
        (httpx.Response(404, json={"detail": "Not Found"}), True),  # --disable-fastapi-docs
        (httpx.Response(401, json={"error": "Unauthorized"}), True),
        (httpx.Response(200, text="<html>"), True),  # not JSON: another server, reached
        (httpx.ConnectError("refused"), False),
        (httpx.ReadTimeout("slow"), False),
    ],
)
async def test_a_backend_counts_as_reached_once_it_answers_anything(
    answer: httpx.Response | Exception, reached: bool
) -> None:
    """``answered`` (what turns a relayed path nobody lists from a 503 into a 404): any HTTP
    answer, an error status or no JSON included, is a backend reached; a refused or
    timed-out read is not."""

    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(answer, Exception):
            raise answer
        return answer

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        catalog = BackendCatalog(client, ttl_s=60, retry_s=10)
        assert not catalog.answered("plain")
        await catalog.refresh(BACKENDS, ["plain"])
        assert catalog.answered("plain") is reached
        assert catalog.paths("plain") == []


async def test_warm_reads_the_available_backends_ahead_of_any_request() -> None:
    """The app's catalog loop: a backend the health poller put down is not read; the others
    are, so the first ``/v1/models`` that follows reads nothing and waits for nothing."""
    backends, now = Backends(), [0.0]
    registry = BackendRegistry(BACKENDS)
    registry.states["draft"].mark(False)
    async with httpx.AsyncClient(transport=httpx.MockTransport(backends)) as client:
        catalog = BackendCatalog(client, ttl_s=60, clock=lambda: now[0])
        await catalog.warm(BACKENDS, registry)
        assert backends.reads == {"plain": 2}  # /openapi.json and /v1/models
        assert catalog.cards("plain") == MODELS["data"] and catalog.cards("draft") == []

        await catalog.refresh(BACKENDS, ["plain"])  # a client's request within the TTL
        assert backends.reads == {"plain": 2}

        registry.states["draft"].mark(True)
        now[0] = 61.0
        await catalog.warm(BACKENDS, registry)  # plain expired, draft now up
        await asyncio.sleep(0.05)  # plain's re-read is not waited for
        assert backends.reads == {"plain": 4, "draft": 2}


async def test_a_backend_back_up_is_read_again_at_once() -> None:
    """A server that went down and came back may be another (restarted with another
    ``--max-model-len``): the next warm reads it, within the dead server's TTL."""
    backends, now = Backends(), [0.0]
    registry = BackendRegistry(BACKENDS)
    async with httpx.AsyncClient(transport=httpx.MockTransport(backends)) as client:
        catalog = BackendCatalog(client, ttl_s=60, clock=lambda: now[0])
        await catalog.warm(BACKENDS, registry)
        assert backends.reads == {"plain": 2, "draft": 2}
        registry.states["draft"].mark(False)
        now[0] = 5.0
        await catalog.warm(BACKENDS, registry)  # down: not read; plain within its TTL
        assert backends.reads == {"plain": 2, "draft": 2}
        registry.states["draft"].mark(True)
        now[0] = 10.0
        await catalog.warm(BACKENDS, registry)  # back up: read again, plain not
        await asyncio.sleep(0.05)
        assert backends.reads == {"plain": 2, "draft": 4}


async def test_a_failing_backend_is_logged_once_a_streak(caplog: pytest.LogCaptureFixture) -> None:
    """The catalog loop re-reads a failing backend every ``retry_s``: its log says so once
    at info (then debug), and once more when it reads again (the simulator's servers, with
    no ``/openapi.json``, logged three lines every 10-12 s)."""
    backends, now = Backends(), [0.0]
    backends.refuse = True
    caplog.set_level(logging.INFO, logger="gateway.upstream.catalog")
    async with httpx.AsyncClient(transport=httpx.MockTransport(backends)) as client:
        catalog = BackendCatalog(client, ttl_s=60, retry_s=10, clock=lambda: now[0])
        for step in range(4):
            now[0] = step * 11.0
            await catalog.refresh(BACKENDS, ["draft"], wait=True)
        assert backends.reads["draft"] == 8  # four reads of two paths
        backends.refuse, now[0] = False, 50.0
        await catalog.refresh(BACKENDS, ["draft"], wait=True)
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert len(lines) == 2
    assert lines[0].startswith("catalog: draft unreadable (ConnectError")
    assert lines[1] == "catalog: draft readable again"
    assert catalog.cards("draft") == MODELS["data"]
