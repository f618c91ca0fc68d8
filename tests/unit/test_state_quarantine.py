"""The quarantine mirror against a real redis-server: an operator's clear reaches every
replica even when it happened while Redis was away; an entry the table's bound evicted is no
clear; a fingerprint cleared before its death is adopted again."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.state.lifespan import redis_client
from gateway.state.quarantine import QuarantineMirror
from gateway.upstream.quarantine import QuarantineTable
from tests.fakes.fleet import running_redis
from tests.fakes.servers import free_port

FP1, FP2 = "a" * 32, "b" * 32


def table(max_entries: int = 16) -> QuarantineTable:
    return QuarantineTable(ttl_s=600, max_entries=max_entries, strikes=2)


def kill(t: QuarantineTable, fp: str) -> None:
    """A death with ``fp`` alone in flight: quarantined at once."""
    t.record([(fp, "/v1/chat/completions")], "plain", "engine dead")


@pytest.fixture
async def client() -> AsyncIterator[Redis]:
    with running_redis() as server:
        c = redis_client(server.url, 0.5)
        yield c
        await c.aclose()


async def test_a_clear_made_while_redis_was_away_reaches_the_others(client: Redis) -> None:
    a, b = table(), table()
    ma, mb = (QuarantineMirror(t, replica=n, prefix="t") for t, n in ((a, "a"), (b, "b")))
    kill(a, FP1)
    await ma.sync(client)
    await mb.sync(client)
    assert b.is_quarantined(FP1) and b.quarantined_total == 0  # adopted, not its own death
    assert a.clear(FP1) == 1
    away = redis_client(f"redis://127.0.0.1:{free_port()}/0", 0.2)
    with pytest.raises(RedisConnectionError):
        await ma.sync(away)  # nothing reached Redis: the clear is still to be told
    await away.aclose()
    await ma.sync(client)
    await mb.sync(client)
    assert not b.is_quarantined(FP1) and await client.zscore("t:quarantine", FP1) is None
    kill(a, FP1)  # a new death after the clear: quarantined again, fleet-wide
    await ma.sync(client)
    await mb.sync(client)
    assert b.is_quarantined(FP1)


async def test_an_entry_the_bound_evicted_is_no_clear(client: Redis) -> None:
    a, b = table(max_entries=1), table()
    ma, mb = (QuarantineMirror(t, replica=n, prefix="t") for t, n in ((a, "a"), (b, "b")))
    kill(a, FP1)
    await ma.sync(client)
    kill(a, FP2)  # the bound (1) evicts FP1 here
    assert not a.is_quarantined(FP1)
    await ma.sync(client)
    await mb.sync(client)
    assert b.is_quarantined(FP1) and b.is_quarantined(FP2)
    assert await client.zcard("t:quarantine:cleared") == 0
