"""Three gateway replicas (real uvicorn servers) sharing state through a real redis-server,
in front of the same fake backends: what one learns, all route on; what one quarantines,
all refuse; Redis killed mid-run fails no request, and state converges when it is back."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from gateway.speculation.spec_params import SpecParams
from gateway.state.refusals import RefusalMirror
from tests.fakes.fleet import Fleet, RedisProcess, redis_config, running_fleet, running_redis
from tests.unit.conftest import MODEL, eventually, local_config

CODE = {"model": MODEL, "prompt": "def f(x):", "max_tokens": 16, "temperature": 0}
CODE_TASK = {"x-task-type": "code"}
SLOW = "ngram"
POISON = "\u0436" * 50
DEADLY = {"model": MODEL, "messages": [{"role": "user", "content": f"Hi {POISON}"}], "seed": 1}


@pytest.fixture
def redis_server() -> Iterator[RedisProcess]:
    with running_redis() as server:
        yield server


@pytest.fixture
def fleet(redis_server: RedisProcess) -> Iterator[Fleet]:
    config = redis_config(local_config(), redis_server.url, sync_interval_s=0.5)
    with running_fleet(config) as fleet:
        for fake in fleet.fakes.values():
            fake.tokens = 12  # enough to teach the learner (min_tokens 8)
        fleet.fakes[SLOW].first_delay_s = 0.3  # ~40 tokens/s against thousands elsewhere
        yield fleet


async def explain(client: httpx.AsyncClient, url: str) -> dict[str, Any]:
    response = await client.post(f"{url}/routes/explain", json=CODE, headers=CODE_TASK)
    assert response.status_code == 200, response.text
    adaptive: dict[str, Any] = response.json()["adaptive"]
    return adaptive


def order(adaptive: dict[str, Any]) -> list[str]:
    """The candidates by Thompson draw, fastest first (what the choice ranks on)."""
    estimates = sorted(adaptive["estimates"], key=lambda e: -(e["draw_tps"] or 0.0))
    return [e["backend"] for e in estimates]


def measured(adaptive: dict[str, Any], backend: str) -> bool:
    return any(e["backend"] == backend and e["source"] != "prior" for e in adaptive["estimates"])


async def routes(client: httpx.AsyncClient, url: str) -> dict[str, Any]:
    body: dict[str, Any] = (await client.get(f"{url}/routes")).json()
    return body


async def test_a_backend_learnt_slow_by_one_replica_is_ordered_last_by_all(fleet: Fleet) -> None:
    first, others = fleet.urls[0], fleet.urls[1:]
    async with httpx.AsyncClient(timeout=10) as client:
        for _ in range(40):  # only replica 0 serves: it tries every candidate, then knows
            ok = await client.post(f"{first}/v1/completions", json=CODE, headers=CODE_TASK)
            assert ok.status_code == 200
            mine = await explain(client, first)
            if measured(mine, SLOW) and order(mine)[-1] == SLOW:
                break
        else:
            pytest.fail("replica 0 never learnt that ngram is slow")

        async def all_know() -> bool:
            seen = [await explain(client, url) for url in others]
            return all(measured(a, SLOW) and order(a)[-1] == SLOW for a in seen)

        took = await eventually(all_know, within_s=5.0)
        for url in others:
            state = await routes(client, url)
            assert state["adaptive"]["observations"] == 0  # learnt nothing itself
            assert state["state"]["up"] is True and "r0" in state["state"]["peers"]
            assert state["state"]["peer_observations"] >= 1
        print(f"replicas 1 and 2 ordered {SLOW} last {took:.2f} s after replica 0 did")


async def test_a_fingerprint_quarantined_by_one_replica_is_refused_by_all(fleet: Fleet) -> None:
    for fake in fleet.fakes.values():
        fake.poison = POISON
    path = "/v1/chat/completions"
    async with httpx.AsyncClient(timeout=10) as client:
        died = await client.post(fleet.urls[0] + path, json=DEADLY)
        assert died.status_code == 500 and died.json()["error"]["code"] == "backend_died"
        reached = sum(len(f.received) for f in fleet.fakes.values())

        async def adopted() -> bool:
            tables = [(await client.get(f"{u}/routes/quarantine")).json() for u in fleet.urls]
            return all(t["quarantined"] == 1 for t in tables)

        await eventually(adopted, within_s=5.0)
        for url in fleet.urls:  # retried on every replica, streamed or not: refused
            for body in (DEADLY, DEADLY | {"stream": True}):
                again = await client.post(url + path, json=body)
                assert again.status_code == 422, again.text
                assert again.json()["error"]["code"] == "request_quarantined"
        assert sum(len(f.received) for f in fleet.fakes.values()) == reached
        table = (await client.get(f"{fleet.urls[2]}/routes/quarantine")).json()
        [entry] = table["entries"]
        assert "at replica r0" in entry["deaths"][-1]["signal"]

        # an operator clears it on one replica: cleared on all
        cleared = await client.delete(f"{fleet.urls[1]}/routes/quarantine/{entry['fingerprint']}")
        assert cleared.json() == {"cleared": 1}

        async def gone() -> bool:
            tables = [(await client.get(f"{u}/routes/quarantine")).json() for u in fleet.urls]
            return all(t["quarantined"] == 0 for t in tables)

        await eventually(gone, within_s=5.0)


async def test_redis_killed_mid_run_fails_nothing_and_state_converges_when_back(
    fleet: Fleet, redis_server: RedisProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.state.sync")
    total, concurrent = 400, 200
    statuses: list[int] = []
    # a fresh connection per request: httpcore's pool, shared by the three replicas, can close
    # a kept-alive connection already handed to a request, under it (encode/httpcore#1110;
    # python -m bench.keepalive: plain uvicorn servers see it as often as the gateway)
    limits = httpx.Limits(max_connections=concurrent, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        gate, third = asyncio.Semaphore(concurrent), asyncio.Event()

        async def one(i: int) -> None:
            async with gate:
                url = fleet.urls[i % len(fleet.urls)]  # round-robin
                body = CODE | {"stream": i % 2 == 0}
                r = await client.post(f"{url}/v1/completions", json=body, headers=CODE_TASK)
                statuses.append(r.status_code)
                if len(statuses) == total // 3:
                    third.set()

        async def outage() -> None:
            await third.wait()  # a third answered, the rest in flight or queued
            redis_server.kill()

        await asyncio.gather(outage(), *(one(i) for i in range(total)))
        assert statuses.count(200) == total, sorted(set(statuses))

        async def all_down() -> bool:
            states = [await routes(client, u) for u in fleet.urls]
            return not any(s["state"]["up"] for s in states)

        await eventually(all_down, within_s=5.0)
        metrics = (await client.get(f"{fleet.urls[0]}/metrics")).text
        assert 'specgate_state_backend_up{backend="redis"} 0.0' in metrics
        more = [
            await client.post(f"{u}/v1/completions", json=CODE, headers=CODE_TASK)
            for u in fleet.urls * 3
        ]
        assert [r.status_code for r in more] == [200] * 9  # still serving, on local state
        # this fleet's warnings only (an earlier test's replicas may still be winding down)
        warned = [
            r
            for r in caplog.records
            if r.levelno == logging.WARNING and redis_server.url in r.getMessage()
        ]
        assert len(warned) == 3, [r.getMessage() for r in warned]  # once per replica

        redis_server.start()  # back, and empty (no persistence)

        async def converged() -> bool:
            states = [await routes(client, u) for u in fleet.urls]
            own = [s["adaptive"]["observations"] for s in states]
            return all(
                s["state"]["up"]
                and len(s["state"]["peers"]) == 2
                and s["state"]["peer_observations"] == sum(own) - mine
                for s, mine in zip(states, own, strict=True)
            )

        await eventually(converged, within_s=5.0)
        assert sum(r.getMessage().endswith("state published and read") for r in caplog.records) == 3
        keys = redis_server.client().keys("specgate:learning:*")
        assert sorted(keys) == [
            b"specgate:learning:r0",
            b"specgate:learning:r1",
            b"specgate:learning:r2",
        ]


async def test_a_speculation_refusal_learnt_by_one_replica_is_known_to_all(fleet: Fleet) -> None:
    backend_of = {"ngram": "ngram", "draft_model": "draft", "eagle3": "eagle3"}
    for name in backend_of.values():
        fleet.fakes[name].refuses = ("repetition_penalty",)
    fleet.fakes[SLOW].first_delay_s = 0.0
    body = CODE | {"repetition_penalty": 1.3}
    async with httpx.AsyncClient(timeout=10) as client:
        first = await client.post(f"{fleet.urls[0]}/v1/completions", json=body, headers=CODE_TASK)
        assert first.status_code == 200 and first.headers["x-specgate-backend"] == "plain"
        learnt = (await routes(client, fleet.urls[0]))["decisions"]["speculation_refuses"]
        [(key, names)] = learnt["learnt"].items()
        assert names == ["repetition_penalty"]
        refused_by = backend_of[key.split()[0]]

        async def everyone_knows() -> bool:
            states = [await routes(client, u) for u in fleet.urls[1:]]
            return all(
                s["decisions"]["speculation_refuses"]["learnt"].get(key) == names for s in states
            )

        await eventually(everyone_knows, within_s=5.0)
        before = len(fleet.fakes[refused_by].received)
        for url in fleet.urls[1:] * 4:  # never sent to the method the fleet knows refuses
            ok = await client.post(f"{url}/v1/completions", json=body, headers=CODE_TASK)
            assert ok.status_code == 200
        assert len(fleet.fakes[refused_by].received) == before


async def test_a_refusal_of_a_field_every_request_sets_is_not_adopted(
    redis_server: RedisProcess,
) -> None:
    """A replica from before ``NEVER_REFUSED`` could have published ``model`` (learnt from a
    message quoting the request); adopting it would take speculation from every request."""
    client = Redis.from_url(redis_server.url, decode_responses=True)
    try:
        await client.sadd("p:spec-refusals", "eagle3 /v1/completions model")
        await client.sadd("p:spec-refusals", "eagle3 /v1/completions top_k")
        params = SpecParams()
        await RefusalMirror(params, prefix="p").sync(client)
        assert params.learnt == {("eagle3", "/v1/completions"): {"top_k"}}
    finally:
        await client.aclose()


async def test_a_response_stored_through_one_replica_is_reached_through_all(fleet: Fleet) -> None:
    code = "Write a Python function that parses this CSV:\n```python\ndef parse(p):\n    pass\n```"
    body = {"model": MODEL, "temperature": 0, "input": code}
    async with httpx.AsyncClient(timeout=10) as client:
        created = await client.post(f"{fleet.urls[0]}/v1/responses", json=body)
        assert created.status_code == 200, created.text
        holder, rid = created.headers["x-specgate-backend"], created.json()["id"]
        assert rid in fleet.fakes[holder].stored
        assert holder != "plain"  # where the others would send a GET by chance

        async def known() -> bool:
            states = [(await routes(client, u))["state"] for u in fleet.urls[1:]]
            return all(s["responses_adopted"] == 1 for s in states)

        await eventually(known, within_s=5.0)
        for url in fleet.urls[1:]:
            got = await client.get(f"{url}/v1/responses/{rid}")
            assert got.status_code == 200 and got.headers["x-specgate-backend"] == holder
            follow = {"model": MODEL, "input": "and again", "previous_response_id": rid}
            again = await client.post(f"{url}/v1/responses", json=follow)
            assert again.status_code == 200 and again.headers["x-specgate-backend"] == holder
