"""Containment in process: a request that kills its backend is answered 500 once, not
failed over, then refused (422) however it is retried; ordinary failures are not."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from gateway.app import create_app
from gateway.settings import Settings
from gateway.upstream.deaths import DeathWatch, stream_error_message
from gateway.upstream.quarantine import QuarantineTable
from gateway.upstream.state import BackendRegistry
from tests.fakes.fake_vllm import ENGINE_DEAD_BODY, FakeBehaviour, create_fake_vllm
from tests.fakes.transport import BackendsTransport
from tests.unit.conftest import MODEL, InProcess, local_config

POISON = "\u0436" * 50  # the fakes' query of death: this text in a body kills the engine
DEADLY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": f"Tell me a story. {POISON}"}],
    "seed": 1,
    "temperature": 1.0,
}
SAFE = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story."}]}
CHAT = "/v1/chat/completions"


def poison_all(gw: InProcess, death: str = "500") -> None:
    for fake in gw.fakes.values():
        fake.poison, fake.death = POISON, death


def dead(gw: InProcess) -> list[str]:
    return [name for name, fake in gw.fakes.items() if fake.engine_dead]


async def test_query_of_death_kills_one_backend_then_is_refused(gw: InProcess) -> None:
    poison_all(gw)
    first = await gw.client.post(CHAT, json=DEADLY)
    assert first.status_code == 500, first.text
    error = first.json()["error"]
    assert error["code"] == "backend_died" and error["type"] == "server_error"
    assert "not retried on another backend" in error["message"]
    assert dead(gw) == ["plain"]  # hot chat goes to plain; no failover to ngram or draft
    assert sum(len(f.received) for f in gw.fakes.values()) == 1
    # an SDK's retries, a streamed retry, another user: refused without reaching a backend
    for retry in (DEADLY, DEADLY, DEADLY | {"stream": True, "user": "bob"}):
        again = await gw.client.post(CHAT, json=retry)
        assert again.status_code == 422
        assert again.json()["error"]["code"] == "request_quarantined"
        assert again.headers["x-should-retry"] == "false"
        assert len(again.headers["x-specgate-fingerprint"]) == 32
    assert sum(len(f.received) for f in gw.fakes.values()) == 1
    assert dead(gw) == ["plain"]
    # other requests go on, to the backends that are still alive
    ok = await gw.client.post(CHAT, json=SAFE)
    assert ok.status_code == 200 and ok.headers["x-specgate-backend"] != "plain"


async def test_a_process_that_vanishes_under_one_request_makes_it_a_suspect(
    gw: InProcess,
) -> None:
    """No engine error (the connection dropped, /health fails): it may have been killed from
    outside, so the lone request gets a strike, not the quarantine; a second such death
    quarantines it (a query of death that kills the process is stopped at two backends)."""
    poison_all(gw, "drop")
    first = await gw.client.post(CHAT, json=DEADLY)
    assert first.status_code == 500 and "only a suspect" in first.json()["error"]["message"]
    second = await gw.client.post(CHAT, json=DEADLY)  # the SDK's retry
    assert second.status_code == 500 and "now refused" in second.json()["error"]["message"]
    assert len(dead(gw)) == 2
    for retry in (DEADLY, DEADLY | {"stream": True}):
        assert (await gw.client.post(CHAT, json=retry)).status_code == 422
    assert len(dead(gw)) == 2


async def test_admin_views_list_and_clear_the_quarantine(gw: InProcess) -> None:
    poison_all(gw)
    await gw.client.post(CHAT, json=DEADLY)
    refused = await gw.client.post(CHAT, json=DEADLY)
    fp = refused.headers["x-specgate-fingerprint"]
    routes = (await gw.client.get("/routes")).json()
    plain = next(b for b in routes["backends"] if b["name"] == "plain")
    assert plain["deaths"] == 1 and plain["healthy"] is False
    assert plain["last_death"]["in_flight"] == 1
    assert "EngineCore encountered an issue" in plain["last_death"]["signal"]
    assert routes["quarantine"] | {"ttl_s": 0} == {
        "ttl_s": 0,
        "quarantined": 1,
        "suspects": 0,
        "quarantined_total": 1,
        "refused": 1,
        "deaths": 1,
    }
    table = (await gw.client.get("/routes/quarantine")).json()
    assert [e["fingerprint"] for e in table["entries"]] == [fp]
    assert POISON not in json.dumps(table) and POISON not in json.dumps(routes)
    metrics = (await gw.client.get("/metrics")).text
    assert 'specgate_backend_deaths_total{backend="plain"} 1.0' in metrics
    assert "specgate_quarantined_requests 1.0" in metrics
    assert "specgate_quarantine_refused_total 1.0" in metrics
    assert (await gw.client.delete(f"/routes/quarantine/{fp}")).json() == {"cleared": 1}
    assert (await gw.client.delete(f"/routes/quarantine/{fp}")).status_code == 404
    for name in ("eagle3", "ngram", "draft"):
        gw.fakes[name].poison = None
    cleared = await gw.client.post(CHAT, json=DEADLY)  # served again (plain is still down)
    assert cleared.status_code == 200 and cleared.headers["x-specgate-backend"] != "plain"


async def test_an_ordinary_500_is_relayed_and_quarantines_nothing(gw: InProcess) -> None:
    gw.fakes["plain"].status = 500  # /health still 200: the backend is alive
    resp = await gw.client.post(CHAT, json=SAFE)
    assert resp.status_code == 500
    assert resp.json()["error"]["message"] == "fake 500"  # the backend's own answer
    routes = (await gw.client.get("/routes")).json()
    assert routes["quarantine"]["quarantined"] == 0 and routes["quarantine"]["deaths"] == 0
    assert (await gw.client.post(CHAT, json=SAFE)).status_code == 500  # not refused


async def test_a_request_sent_to_an_already_dead_backend_fails_over(gw: InProcess) -> None:
    plain = gw.fakes["plain"]
    plain.poison = POISON
    assert (await gw.client.post(CHAT, json=DEADLY)).status_code == 500
    # the gateway marked plain unhealthy; make routing still try it first, as a request
    # decided a moment before the death would
    gw.app.state.runtime.gateway.registry.states["plain"].healthy = None
    resp = await gw.client.post(CHAT, json=SAFE)
    assert resp.status_code == 200 and resp.headers["x-specgate-backend"] != "plain"
    assert (await gw.client.get("/routes")).json()["quarantine"]["quarantined"] == 1


async def test_victims_in_flight_are_suspects_not_quarantined(gw: InProcess) -> None:
    plain = gw.fakes["plain"]
    plain.first_delay_s = 0.2  # the victims are in flight when the poison arrives
    victims = [
        asyncio.ensure_future(gw.client.post(CHAT, json=SAFE | {"seed": i})) for i in range(3)
    ]
    await asyncio.sleep(0.05)
    plain.poison, plain.first_delay_s = POISON, 0.0
    killer = await gw.client.post(CHAT, json=DEADLY)
    answers = await asyncio.gather(*victims)
    assert killer.status_code == 500
    for resp in answers:
        error = resp.json()["error"]
        assert resp.status_code == 500 and error["code"] == "backend_died"
        assert "only a suspect" in error["message"]
    table = (await gw.client.get("/routes/quarantine")).json()
    assert table["quarantined"] == 0 and table["suspects"] == 4
    assert (await gw.client.post(CHAT, json=SAFE | {"seed": 0})).status_code == 200


def test_the_fake_answers_like_vllm() -> None:
    assert "EngineCore encountered an issue" in ENGINE_DEAD_BODY["error"]["message"]


async def test_supervised_processes_show_on_routes_status_and_metrics() -> None:
    view = {
        "plain": {
            "state": "running",
            "pid": 4242,
            "running": True,
            "restarts": 1,
            "crashes": 1,
            "last_crash": {
                "reason": "process exited with code 1",
                "exit_code": 1,
                "at": 0.0,
                "log_tail": "INFO: Application shutdown complete.",
                "errors": ["RuntimeError: CPU Generator does not use offset"],
            },
            "next_start_in_s": None,
        }
    }
    config = local_config()
    apps = {
        b.base_url.removeprefix("http://"): create_fake_vllm(FakeBehaviour())
        for b in config.backends.values()
    }
    app = create_app(
        Settings(health_interval_s=60),
        config=config,
        transport=BackendsTransport(apps),
        processes=lambda: view,
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            routes = (await client.get("/routes")).json()
            status = (await client.get("/status")).text
            metrics = (await client.get("/metrics")).text
    plain = next(b for b in routes["backends"] if b["name"] == "plain")
    assert plain["process"] == view["plain"]
    assert next(b for b in routes["backends"] if b["name"] == "ngram")["process"] is None
    assert "process running,\n        1 restart" in status
    assert "CPU Generator does not use offset" in status
    assert 'specgate_backend_restarts_total{backend="plain"} 1.0' in metrics
    assert 'specgate_backend_process_up{backend="plain"} 1.0' in metrics


@pytest.mark.parametrize("death", ["drop", "500"])
async def test_a_backend_killed_under_load_is_one_death_and_blames_no_innocent(
    gw: InProcess, death: str
) -> None:
    """60 requests in flight on plain (20 distinct bodies, each sent 3 times) when it is
    killed: the process vanishing (``drop``: every connection reset, /health failing) or its
    engine killed from outside (``500``: every request gets vLLM's EngineDeadError). One
    death, however many requests saw it; nobody quarantined; with the engine error each
    distinct body is struck once (a suspect) and answered 500 ``backend_died``; without it
    nobody is blamed, and each request moves on to another backend and is answered."""
    plain = gw.fakes["plain"]
    plain.first_delay_s = 0.3  # the requests are in flight when the kill comes
    bodies = [SAFE | {"seed": i % 20} for i in range(60)]
    pending = [asyncio.ensure_future(gw.client.post(CHAT, json=b)) for b in bodies]
    await asyncio.sleep(0.1)
    plain.engine_dead, plain.healthy, plain.death = True, False, death  # the kill
    answers = await asyncio.gather(*pending)
    on_plain = [r for r in answers if r.headers.get("x-specgate-backend", "plain") == "plain"]
    if death == "drop":  # blames nobody: every request failed over, none lost
        assert [r.status_code for r in answers] == [200] * 60
        assert on_plain == []
    else:
        assert len(on_plain) >= 50, [r.status_code for r in answers]
        assert {r.status_code for r in on_plain} == {500}
        assert {r.json()["error"]["code"] for r in on_plain} == {"backend_died"}
    routes = (await gw.client.get("/routes")).json()
    deaths = {b["name"]: b["deaths"] for b in routes["backends"]}
    assert deaths == {"plain": 1, "ngram": 0, "draft": 0, "eagle3": 0}, deaths
    assert routes["quarantine"]["quarantined"] == 0
    assert routes["quarantine"]["suspects"] == (20 if death == "500" else 0)
    plain.first_delay_s = 0.0
    for body in bodies[:20]:  # every one of them is served again, elsewhere
        again = await gw.client.post(CHAT, json=body)
        assert again.status_code == 200 and again.headers["x-specgate-backend"] != "plain"


async def test_a_second_death_under_a_request_ends_it(gw: InProcess) -> None:
    """A request moves on from a death that blames nobody once: if the backend it moved to
    is killed under it too, it is answered 500 ``backend_died`` (a query of death that kills
    a process without an engine error takes down at most two backends per client request)."""
    for fake in gw.fakes.values():
        fake.first_delay_s = 0.3
    pending = [
        asyncio.ensure_future(gw.client.post(CHAT, json=SAFE | {"seed": i})) for i in range(8)
    ]
    await asyncio.sleep(0.1)
    plain = gw.fakes["plain"]
    plain.engine_dead, plain.healthy, plain.death = True, False, "drop"  # moved on from here
    await asyncio.sleep(0.15)  # every request in flight on the backend it moved to
    for name, fake in gw.fakes.items():
        if name != "plain":
            fake.engine_dead, fake.healthy, fake.death = True, False, "drop"
    answers = await asyncio.gather(*pending)
    assert [r.status_code for r in answers] == [500] * 8
    assert {r.json()["error"]["code"] for r in answers} == {"backend_died"}
    assert {r.headers.get("x-should-retry") for r in answers} == {"false"}  # no SDK retry
    # each ended at the backend it had moved to, not at plain
    assert not any("Backend 'plain' died" in r.json()["error"]["message"] for r in answers)
    routes = (await gw.client.get("/routes")).json()
    assert routes["quarantine"]["quarantined"] == 0
    assert sum(b["deaths"] for b in routes["backends"]) >= 2


async def test_attempts_failing_together_share_one_probe_and_one_death() -> None:
    """Five attempts dropped at once, the /health probe slow (50 ms): one probe, one death
    event, nobody blamed (the issue's SIGKILL was counted as 5 deaths, 4 requests
    quarantined); a participant failing after the backend came back belongs to that death."""
    probes = 0

    async def health(request: httpx.Request) -> httpx.Response:
        nonlocal probes
        probes += 1
        await asyncio.sleep(0.05)
        return httpx.Response(503)

    registry = BackendRegistry(["plain"])
    table = QuarantineTable(ttl_s=600, max_entries=100, strikes=2)
    async with httpx.AsyncClient(transport=httpx.MockTransport(health)) as client:
        watch = DeathWatch(client, registry, table, probe_timeout_s=1.0, min_event_s=0.0)
        ids = [watch.begin("plain", CHAT, SAFE | {"seed": i}) for i in range(5)]
        checks = [watch.check("plain", "http://p", a, "dropped", confirmed=False) for a in ids]
        deaths = await asyncio.gather(*checks)
        assert probes == 1 and watch.deaths == {"plain": 1}
        assert all(d is not None and d.participant and d.event is deaths[0].event for d in deaths)
        assert all(d is not None and not d.quarantined and not d.suspect for d in deaths)
        assert table.counts() == (0, 0)
        registry.states["plain"].healthy = True  # restarted: the event closes
        late = await watch.check("plain", "http://p", ids[0], "stream cut", confirmed=False)
        assert late is not None and late.event is deaths[0].event and watch.deaths["plain"] == 1
        # the same event confirmed later by an engine error: strikes, once each
        again = await watch.check("plain", "http://p", ids[1], "HTTP 500: Engine", confirmed=True)
        assert again is not None and again.suspect and table.counts() == (0, 5)
        await watch.check("plain", "http://p", ids[2], "HTTP 500: Engine", confirmed=True)
        assert [e.strikes for e in table.entries()] == [1] * 5


ANSWER_CHUNK = {  # an ordinary chunk whose own text and logprobs say "error" and a marker
    "choices": [
        {
            "index": 0,
            "text": " EngineDeadError",
            "logprobs": {"tokens": ["error"], "top_logprobs": [{"error": -0.1}]},
        }
    ]
}
VLLM_FAILURE = {"error": {"message": ENGINE_DEAD_BODY["error"]["message"], "code": 500}}
GRAMMAR_ERROR = {
    "error": {
        "message": "Grammar error: unterminated group (EngineDeadError",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
}


@pytest.mark.parametrize(
    ("tail", "message"),
    [
        (f"data: {json.dumps(ANSWER_CHUNK)}\n\ndata: [DONE]\n\n".encode(), None),
        (
            f"data: {json.dumps(VLLM_FAILURE)}\n\ndata: [DONE]\n\n".encode(),
            b"EngineCore encountered an issue. See stack trace (above) for the root cause.",
        ),
        (b'rror": {"message": "cut"}}\n\ndata: {"error": {"message": "whole"}}\n\n', b"whole"),
        (
            b'event: error\ndata: {"type": "error", "error": {"type": "x", "message": "m"}}\n\n',
            b"m",
        ),
        (b'data: {"error": "a string, not vLLM\'s envelope"}\n\n', None),
        # vLLM streams a grammar error with the client's own regex in it: the client's fault
        (f"data: {json.dumps(GRAMMAR_ERROR)}\n\ndata: [DONE]\n\n".encode(), None),
        (
            b'event: error\ndata: {"type": "error", "error": {"type": "BadRequestError", '
            b'"message": "EngineDeadError"}}\n\n',
            None,
        ),
    ],
)
def test_only_an_error_event_ending_a_stream_is_read_for_a_death(
    tail: bytes, message: bytes | None
) -> None:
    """An answer whose text (or, with ``logprobs``, a token) says "error" and an engine-dead
    marker is no death: only the error envelope of vLLM's failure event is read."""
    assert stream_error_message(tail) == message


async def test_a_clients_own_error_streamed_back_is_no_death(gw: InProcess) -> None:
    """vLLM streams some client errors as a 200 and a 400 error event that repeats the
    client's text (a grammar error quotes its regex): text such as "EngineDeadError" there
    must not confirm a death (it marked plain down and quarantined the request)."""
    gw.fakes["plain"].refuses = ("EngineDeadError",)  # its error event names the field
    body = SAFE | {"stream": True, "EngineDeadError": 1}
    for _ in range(2):
        resp = await gw.client.post(CHAT, json=body)
        assert resp.status_code == 200 and "EngineDeadError" in resp.text
        assert resp.headers["x-specgate-backend"] == "plain"
    routes = (await gw.client.get("/routes")).json()
    assert {b["name"]: b["deaths"] for b in routes["backends"]}["plain"] == 0
    assert routes["quarantine"]["quarantined"] == 0 and routes["quarantine"]["suspects"] == 0
    assert next(b for b in routes["backends"] if b["name"] == "plain")["healthy"] is True
