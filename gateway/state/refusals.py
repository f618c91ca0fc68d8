"""Learnt speculation refusals shared through Redis: learnt by one replica, known to all.

A speculative backend's 400 that refuses in vLLM's words teaches a replica that some
sampling parameters are refused by every backend of that method on that endpoint
(:class:`~gateway.speculation.spec_params.SpecParams`). The fleet's knowledge is the union of
what its replicas learnt: the Redis set ``P:spec-refusals`` holds one ``method endpoint
parameter`` member per fact (``SADD`` is idempotent; nothing is ever removed, as locally).
A member naming a field every request sets (``NEVER_REFUSED``: ``model``, ``prompt``...) is
not adopted: a replica before that rule could learn one from a message quoting the request.
"""

from __future__ import annotations

from redis.asyncio import Redis

from gateway.speculation.spec_params import NEVER_REFUSED, SpecParams

SEP = " "


class RefusalMirror:
    """Keeps ``params.learnt`` and the set ``<prefix>:spec-refusals`` in step (union)."""

    def __init__(self, params: SpecParams, *, prefix: str) -> None:
        self.params, self.key = params, f"{prefix}:spec-refusals"
        self.published: set[str] = set()  # members Redis confirmed holding

    def _local(self) -> set[str]:
        return {
            SEP.join((method, endpoint, name))
            for (method, endpoint), names in self.params.learnt.items()
            for name in names
        }

    async def sync(self, client: Redis) -> None:
        """Publish what was learnt here, adopt what the others learnt (raises what redis-py
        raises)."""
        local = self._local()
        async with client.pipeline(transaction=False) as pipe:
            new = sorted(local - self.published)
            if new:
                pipe.sadd(self.key, *new)
            pipe.smembers(self.key)
            *_, members = await pipe.execute()
        remote = set(members)
        for member in remote - local:
            parts = member.split(SEP)
            if len(parts) == 3 and parts[2] not in NEVER_REFUSED:  # an older replica's mistake
                method, endpoint, name = parts
                self.params.learnt.setdefault((method, endpoint), set()).add(name)
        self.published = remote  # what Redis lost (a restart) is published again next time
