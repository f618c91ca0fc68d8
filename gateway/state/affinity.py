"""Response affinity shared through Redis: a Response created through one replica can be
continued (``previous_response_id``), fetched or cancelled through any.

vLLM keeps a stored Response on the server that created it; each replica remembers ``id ->
backend`` from the create answers it relays (:mod:`gateway.upstream.affinity`). Here every
replica publishes the ids it learnt into ``P:responses`` (a sorted set of id -> Unix time
stored) and ``P:responses:backend`` (a hash of id -> backend) and adopts the others' at each
sync, so the lookup on the request path stays local. A follow-up sent to another replica
within a sync interval of the create may not find it yet (then it is routed as before).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from redis.asyncio import Redis

from gateway.upstream.affinity import ResponseAffinity


class SharedAffinity(ResponseAffinity):
    """A :class:`ResponseAffinity` that also queues what it learns for publication
    (:attr:`pending`); :meth:`adopt` records a peer's entry without queueing it."""

    def __init__(
        self,
        *,
        max_entries: int = 100_000,
        ttl_s: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(max_entries=max_entries, ttl_s=ttl_s, clock=clock)
        self.pending: dict[str, str] = {}

    def remember(self, response_id: str, backend: str) -> None:
        """Record ``backend`` as the holder of ``response_id`` here and for the peers."""
        super().remember(response_id, backend)
        if len(self.pending) < self.max_entries:
            self.pending[response_id] = backend

    def adopt(self, response_id: str, backend: str) -> None:
        """Record a peer's entry (not published again)."""
        super().remember(response_id, backend)


class AffinityMirror:
    """Publishes ``affinity.pending`` and adopts the peers' entries (module docstring);
    ``clock``: Unix seconds."""

    def __init__(
        self,
        affinity: SharedAffinity,
        *,
        prefix: str,
        interval_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.affinity, self.clock = affinity, clock
        self.zset, self.hash = f"{prefix}:responses", f"{prefix}:responses:backend"
        self.since = clock() - affinity.ttl_s  # read everything still alive at the first sync
        # stored during the last read, or by a peer whose clock is a little behind: read again
        self.slack_s = max(2 * interval_s, 10.0)
        self.adopted = 0

    async def sync(self, client: Redis) -> None:
        """One exchange (raises what redis-py raises; a failed sync keeps ``pending``)."""
        now, pending = self.clock(), dict(self.affinity.pending)
        async with client.pipeline(transaction=False) as pipe:
            if pending:
                pipe.zadd(self.zset, dict.fromkeys(pending, now))
                for rid, backend in pending.items():
                    pipe.hset(self.hash, rid, backend)
            pipe.zrangebyscore(self.zset, "-inf", now - self.affinity.ttl_s)
            pipe.zrangebyscore(self.zset, self.since - self.slack_s, "+inf")
            *_, expired, fresh = await pipe.execute()
        for key in pending:
            self.affinity.pending.pop(key, None)
        self.since = now
        ids = [i.decode() if isinstance(i, bytes) else i for i in fresh]
        ids = [i for i in ids if i not in pending and self.affinity.backend_of(i) is None]
        if ids:
            for rid, held in zip(ids, await client.hmget(self.hash, ids), strict=True):
                if held is not None:
                    name = held.decode() if isinstance(held, bytes) else held
                    self.affinity.adopt(rid, name)
                    self.adopted += 1
        if expired:
            await client.zrem(self.zset, *expired)
            await client.hdel(self.hash, *expired)
