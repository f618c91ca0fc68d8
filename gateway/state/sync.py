"""The background loop that shares a replica's state through Redis (``state.backend: redis``).

Every ``sync_interval_s`` one :meth:`RedisState.sync` (bounded by ``4 x timeout_s`` in all)
publishes this replica's adaptive state (:mod:`gateway.learning.store`'s JSON) under
``P:learning:<replica>`` with a TTL of ``peer_ttl_s`` and its name in the sorted set
``P:replicas`` (scored by Unix time), reads the states of the peers seen within
``peer_ttl_s`` and hands their merge to the :class:`~gateway.state.learning.SharedLearner`,
then mirrors quarantines (:class:`~gateway.state.quarantine.QuarantineMirror`), learnt
speculation refusals (:class:`~gateway.state.refusals.RefusalMirror`) and which backend
holds each stored Response (:class:`~gateway.state.affinity.AffinityMirror`).

Requests never wait on Redis: routing reads local copies. When a sync fails (connection
refused, timeout, any Redis error) the replica keeps serving on its own state and the peers'
last read, logs once (a warning; an info line when Redis is back), and shows it in
``/routes`` (``state``) and ``/metrics`` (``specgate_state_backend_up``). The next successful
sync catches up: the replica's state is published whole (what it learnt meanwhile included;
also into a Redis that restarted empty) and its quarantines again where Redis lost them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import ValidationError
from redis.asyncio import Redis
from redis.exceptions import RedisError

from contracts.config import StateSettings
from gateway.learning.store import LearnedState, dump_state, restore_state
from gateway.routing.adaptive import GroupStats, Learner
from gateway.state.affinity import AffinityMirror
from gateway.state.learning import Key, SharedLearner, merge_states
from gateway.state.quarantine import QuarantineMirror
from gateway.state.refusals import RefusalMirror

logger = logging.getLogger(__name__)


def redacted(url: str) -> str:
    """``url`` without its password (what logs and ``/routes`` show)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


@dataclass(frozen=True, slots=True)
class Shared:
    """What a replica shares: its adaptive ``learner`` and the mirrors of its quarantines,
    learnt speculation refusals and stored Responses' backends."""

    learner: SharedLearner
    quarantines: QuarantineMirror
    refusals: RefusalMirror
    responses: AffinityMirror


class RedisState:
    """One replica's link to the fleet's shared state (module docstring).

    ``client``: a ``redis.asyncio`` client (short socket timeouts, no retries of its own:
    the loop is the retry); ``state``: the config's ``state`` block (key prefix, interval,
    timeout, peer TTL); ``where``: the client's URL, password redacted.
    """

    def __init__(
        self, client: Redis, state: StateSettings, shared: Shared, *, where: str, replica: str
    ) -> None:
        self.client, self.where, self.replica = client, where, replica
        self.prefix = state.key_prefix
        self.learner, self.mirror = shared.learner, shared.quarantines
        self.refusals, self.affinity = shared.refusals, shared.responses
        self.interval_s, self.timeout_s = state.sync_interval_s, state.timeout_s
        self.peer_ttl_s = state.peer_ttl_s
        self.up: bool | None = None  # None: not tried yet
        self.error: str | None = None
        self.failures = 0
        self.last_ok: float | None = None  # Unix seconds of the last successful sync
        self.peers: list[str] = []
        self._published: int | None = None  # learner.changes last published
        self._raw: dict[str, tuple[bytes | str, dict[Key, GroupStats], int]] = {}

    async def sync(self) -> bool:
        """One exchange with Redis; False (counted, logged once per outage) when it failed."""
        try:
            async with asyncio.timeout(4 * self.timeout_s):
                await self._learning()
                await self.mirror.sync(self.client)
                await self.refusals.sync(self.client)
                await self.affinity.sync(self.client)
        except (RedisError, OSError, TimeoutError) as exc:
            return self._failed(exc, expected=True)
        except Exception as exc:  # a bug here must not end sharing for good: logged, retried
            return self._failed(exc, expected=False)
        if self.up is False:
            logger.info("shared state: Redis at %s is back; state published and read", self.where)
        self.up, self.error, self.last_ok = True, None, time.time()
        return True

    def _failed(self, exc: Exception, *, expected: bool) -> bool:
        self.failures += 1
        self.error = f"{type(exc).__name__}: {exc}"[:300]
        if self.up is not False:
            logger.warning(
                "shared state: Redis at %s unreachable (%s); serving on this replica's "
                "state until it is back",
                self.where,
                self.error,
                exc_info=None if expected else exc,
            )
        self.up = False
        return False

    async def _learning(self) -> None:
        now, own = time.time(), f"{self.prefix}:learning:{self.replica}"
        replicas, ttl = f"{self.prefix}:replicas", max(1, round(self.peer_ttl_s))
        changes = self.learner.changes  # observations and probe marks
        async with self.client.pipeline(transaction=False) as pipe:
            if changes and changes != self._published:
                pipe.set(own, dump_state(self.learner, now).model_dump_json(), ex=ttl)
            else:
                pipe.expire(own, ttl)
            pipe.zadd(replicas, {self.replica: now})
            pipe.zremrangebyscore(replicas, "-inf", now - self.peer_ttl_s)
            pipe.zrangebyscore(replicas, now - self.peer_ttl_s, "+inf")
            kept, *_, members = await pipe.execute()
        if changes and not kept:
            self._published = None  # Redis lost it (or it expired): published next time
        else:
            self._published = changes
        names = sorted(n for n in members if n != self.replica)
        raws = (
            await self.client.mget([f"{self.prefix}:learning:{n}" for n in names]) if names else []
        )
        self._read_peers(names, raws)

    def _read_peers(self, names: list[str], raws: list[bytes | str | None]) -> None:
        states, total, seen = [], 0, {}
        for name, raw in zip(names, raws, strict=True):
            if raw is None:
                continue
            cached = self._raw.get(name)
            if cached is None or cached[0] != raw:
                parsed = _groups(raw)
                if parsed is None:
                    logger.debug("shared state: unreadable state of replica %s skipped", name)
                    continue
                cached = (raw, *parsed)
            seen[name] = cached
            states.append(cached[1])
            total += cached[2]
        self._raw, self.peers = seen, sorted(seen)
        self.learner.set_peers(merge_states(states, self.learner.decay), total)

    def to_json(self) -> dict[str, Any]:
        """What ``GET /routes`` shows under ``state``."""
        now = time.time()
        return {
            "backend": "redis",
            "url": self.where,
            "replica": self.replica,
            "up": bool(self.up),
            "error": self.error,
            "failures": self.failures,
            "last_sync_ago_s": None if self.last_ok is None else round(now - self.last_ok, 1),
            "sync_interval_s": self.interval_s,
            "peers": self.peers,
            "peer_observations": self.learner.peer_observations,
            "quarantines_adopted": self.mirror.adopted,
            "responses_adopted": self.affinity.adopted,
        }


def _groups(raw: bytes | str) -> tuple[dict[Key, GroupStats], int] | None:
    """A peer's published state as groups and its observation count (None: unreadable)."""
    try:
        state = LearnedState.model_validate_json(raw)
    except ValidationError:
        return None
    learner = Learner(state.decay)
    restore_state(learner, state)
    return learner.groups, learner.observations
