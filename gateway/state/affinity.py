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


class AffinityMirror:
    """Publishes a shared ``affinity``'s ``pending`` entries and adopts the peers' (module
    docstring); ``clock``: Unix seconds."""

    def __init__(
        self,
        affinity: ResponseAffinity,
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
        queue = self.affinity.pending
        assert queue is not None, "a shared ResponseAffinity"
        now, pending = self.clock(), dict(queue)
        async with client.pipeline(transaction=False) as pipe:
            if pending:
                pipe.zadd(self.zset, dict.fromkeys(pending, now))
                for rid, backend in pending.items():
                    pipe.hset(self.hash, rid, backend)
            pipe.zrangebyscore(self.zset, "-inf", now - self.affinity.ttl_s)
            pipe.zrangebyscore(self.zset, self.since - self.slack_s, "+inf")
            *_, expired, fresh = await pipe.execute()
        for key in pending:
            queue.pop(key, None)
        self.since = now
        ids = [i for i in fresh if i not in pending and self.affinity.backend_of(i) is None]
        if ids:
            for rid, held in zip(ids, await client.hmget(self.hash, ids), strict=True):
                if held is not None:
                    self.affinity.adopt(rid, str(held))  # decoded: str already
                    self.adopted += 1
        if expired:
            await client.zrem(self.zset, *expired)
            await client.hdel(self.hash, *expired)
