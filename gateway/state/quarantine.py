"""Quarantined fingerprints mirrored through Redis: quarantined by one replica, refused by all.

Keys (``P`` is ``state.key_prefix``): ``P:quarantine``, a sorted set of fingerprints scored by
the Unix time their quarantine ends; ``P:quarantine:info``, a hash of fingerprint -> JSON
``{"endpoint", "backend", "signal", "in_flight", "at", "replica"}`` (the death that caused it,
``at`` in Unix seconds; never the prompt); ``P:quarantine:cleared``, a sorted set of
fingerprints an operator cleared, scored by when.

Each sync (:meth:`QuarantineMirror.sync`) publishes this replica's quarantines that Redis
does not hold yet, or holds with an earlier end (``ZADD GT``: the latest end wins), adopts
the others' into the local :class:`~gateway.upstream.quarantine.QuarantineTable` (which
the hot path checks without I/O), turns a local clear (``DELETE /routes/quarantine``: an
entry gone before its end while the table counted a clear; one its bound evicted is no
clear) into a tombstone, and applies the others' tombstones to entries whose last death is
older than the clear (a death after it quarantines again). What this replica published and
Redis lost (a restart without persistence) is published again; a sync that fails changes
nothing here, so what it carried is sent by the next. Ends are Unix times in Redis and
monotonic times locally: replicas whose clocks differ by d seconds see an end d seconds
apart.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis

from gateway.upstream.quarantine import DeathRecord, Entry, QuarantineTable

#: Ends closer than this (seconds) count as equal (clock conversions are not exact).
SLACK_S = 1.0


class QuarantineMirror:
    """Keeps ``table`` and the fleet's quarantine in Redis in step (module docstring).

    ``replica``: this replica's name (recorded with what it publishes); ``prefix``: the key
    prefix; ``clock``/``monotonic``: Unix and monotonic seconds (injectable for tests).
    """

    def __init__(
        self,
        table: QuarantineTable,
        *,
        replica: str,
        prefix: str,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.table, self.replica = table, replica
        self.zset = f"{prefix}:quarantine"
        self.info, self.cleared = f"{self.zset}:info", f"{self.zset}:cleared"
        self.clock, self.monotonic = clock, monotonic
        self.known: dict[str, float] = {}  # fingerprint -> end (Unix) agreed with Redis
        self._clears = table.clears  # the table's clear() calls at the last sync
        self.adopted = 0

    def _unix(self, mono: float) -> float:
        return self.clock() + (mono - self.monotonic())

    def _local(self) -> dict[str, Entry]:
        return {e.fingerprint: e for e in self.table.entries() if e.quarantined_until}

    async def sync(self, client: Redis) -> None:
        """One exchange with Redis: publish, clear, read and adopt (raises what redis-py
        raises; the caller counts the failure and tries again next time)."""
        now, local, clears = self.clock(), self._local(), self.table.clears
        gone = [(fp, end) for fp, end in self.known.items() if fp not in local]
        # gone before its end while the table counted a clear (not evicted): cleared here
        tombstones = [fp for fp, end in gone if clears != self._clears and end - SLACK_S > now]
        ends = {fp: self._unix(e.quarantined_until or 0.0) for fp, e in local.items()}
        publish = {fp: end for fp, end in ends.items() if self._wants(fp, end)}
        async with client.pipeline(transaction=False) as pipe:
            for fp in tombstones:
                pipe.zadd(self.cleared, {fp: now})
                pipe.zrem(self.zset, fp)
                pipe.hdel(self.info, fp)
            for fp, end in publish.items():
                pipe.zadd(self.zset, {fp: end}, gt=True)
                pipe.hset(self.info, fp, json.dumps(self._describe(local[fp])))
            pipe.zremrangebyscore(self.cleared, "-inf", now - self.table.ttl_s)
            pipe.zrangebyscore(self.zset, now, "+inf", withscores=True)
            pipe.zrange(self.cleared, 0, -1, withscores=True)
            pipe.zrangebyscore(self.zset, "-inf", now)
            *_, remote_rows, cleared_rows, expired = await pipe.execute()
        # only now, once Redis has them (a failed sync changes nothing: retried next time)
        for fp, _ in gone:
            self.known.pop(fp, None)
        self.known.update(publish)
        self._clears = clears
        remote = {fp: float(end) for fp, end in remote_rows}
        cleared = {fp: float(at) for fp, at in cleared_rows}
        self._apply_clears(cleared, local)
        new = [fp for fp, end in remote.items() if self._wants(fp, end)]
        infos = await client.hmget(self.info, new) if new else []
        for fp, raw in zip(new, infos, strict=True):
            self._adopt(fp, remote[fp], _info(raw), cleared.get(fp))
        for fp in [fp for fp in self.known if fp in local and fp not in remote]:
            if fp not in cleared:
                self.known[fp] = 0.0  # Redis lost it: published again next time
        if expired:
            await client.zrem(self.zset, *expired)
            await client.hdel(self.info, *expired)

    def _wants(self, fp: str, end: float) -> bool:
        return end > self.known.get(fp, 0.0) + SLACK_S

    def _apply_clears(self, cleared: dict[str, float], local: dict[str, Entry]) -> None:
        for fp, at in cleared.items():
            entry = local.get(fp)
            last = self._unix(entry.deaths[-1].at) if entry and entry.deaths else 0.0
            if entry is not None and last <= at:
                self.table.clear(fp)
                self._clears += 1  # this one is the fleet's clear, not a new one from here
                self.known.pop(fp, None)

    def _adopt(self, fp: str, end: float, info: dict[str, Any], cleared_at: float | None) -> None:
        """Quarantine ``fp`` here until ``end`` (Unix), unless its death predates a clear."""
        at = _number(info.get("at"), self.clock())
        if cleared_at is not None and at <= cleared_at:
            return
        mono_now = self.monotonic()
        ago = max(0.0, self.clock() - at)
        death = DeathRecord(
            str(info.get("backend", "?")),
            f"{info.get('signal', '?')} (at replica {info.get('replica', '?')})",
            mono_now - ago,
            int(_number(info.get("in_flight"), 1)),
        )
        until = mono_now + (end - self.clock())
        if self.table.adopt(fp, str(info.get("endpoint", "")), until, death):
            self.adopted += 1
        self.known[fp] = end

    def _describe(self, entry: Entry) -> dict[str, Any]:
        last = entry.deaths[-1] if entry.deaths else None
        return {
            "endpoint": entry.endpoint,
            "backend": last.backend if last else None,
            "signal": last.signal if last else None,
            "in_flight": last.participants if last else None,
            "at": self._unix(last.at) if last else self.clock(),
            "replica": self.replica,
        }


def _info(raw: bytes | str | None) -> dict[str, Any]:
    """A published death's description (``{}`` when missing or unreadable)."""
    try:
        info = json.loads(raw) if raw is not None else {}
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


def _number(value: Any, default: float) -> float:
    return float(value) if isinstance(value, int | float) and value == value else default
