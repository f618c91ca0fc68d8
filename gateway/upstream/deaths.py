"""Linking failed attempts to backend deaths, for containment of queries of death.

The forwarder registers every attempt while it is in flight (:meth:`DeathWatch.begin` /
:meth:`DeathWatch.end`: a dict insert and delete, nothing else on the hot path). When an
attempt fails in a way a dying backend fails (a 5xx, the connection dropped after the
request was sent, a stream cut short or ending with an error event) it asks
:meth:`DeathWatch.check`, which decides whether the backend died:

* **confirmed** at once when the answer says so (``EngineDeadError``, "engine dead", ...:
  :func:`engine_dead_reason`);
* else one ``GET /health`` probe (``probe_timeout_s``): refused, reset or a non-200 status
  means dead; 200 or a timeout means an ordinary failure (no quarantine, failover as usual).

A death is **one event per backend incarnation**, however many attempts saw it: attempts
failing together share one ``/health`` probe, and the event stays open while the backend is
not healthy again (and at least ``min_event_s``); a participant that fails after it closed
still belongs to it. Every attempt in flight there when the event opens is a participant;
the backend is marked unhealthy at once (the poller marks it healthy again once it answers
``/health``), which also ends the attempts still waiting there for an answer (they are
judged as participants: :meth:`~gateway.upstream.attempt.Attempt.given_up_when_down`).
The participants are judged once per event by the
:class:`~gateway.upstream.quarantine.QuarantineTable`'s rule (its module docstring), and
again when another participant's answer confirms the event later. A participant of a death
that blames someone (an engine error, or it was alone in flight) is never failed over (it
may be the query of death); one of a death that blames nobody (the process killed from
outside under load: :attr:`Death.unblamed`) fails over once, as any failure before the
answer does, and a second death under the same request ends it. An attempt that starts
after the death (sent to an already dead backend) is not a participant and fails over.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from contracts.vllm_errors import error_object
from gateway.upstream.quarantine import QuarantineTable, fingerprint
from gateway.upstream.state import BackendRegistry

logger = logging.getLogger(__name__)

#: What a vLLM server (any recent version) says when its engine is gone.
_ENGINE_DEAD = re.compile(
    rb"EngineDeadError|engine (?:is )?dead|EngineCore encountered an issue|"
    rb"Engine loop is not running|AsyncEngineDeadError|EngineGenerateError",
    re.IGNORECASE,
)
#: Bytes of an error body searched for those markers.
ERROR_BODY_LIMIT = 64 * 1024


#: Error types of a client's fault (vLLM's exception names, OpenAI's and Anthropic's), for
#: an error event without a numeric ``code``.
CLIENT_ERROR_TYPES = frozenset(
    {"badrequesterror", "notfounderror", "invalid_request_error", "not_found_error"}
)


def stream_error_message(tail: bytes) -> bytes | None:
    """The message of the server-side error event ending a stream (``tail``: its last
    chunks), as vLLM ends one whose generation failed part-way (``data: {"error":
    {"message": ..., "type": "InternalServerError", "code": 500}}``; Anthropic's shape too).
    None when the last data event is an ordinary one, so an answer whose own text says
    "error" or "engine is dead" (with ``logprobs``, a token ``"error"``) is no death, and
    None for a client's error (``code`` below 500, or a client error type when there is no
    code): vLLM streams a grammar error as ``BadRequestError`` 400 with the client's own
    regex or schema in its message, which must not confirm a death by its words. The data
    lines are vLLM's, one JSON object each (:func:`contracts.vllm_errors.error_object`); a line cut
    at the tail's start has no ``data:`` prefix and is skipped."""
    for line in reversed(tail.splitlines()):
        if not line.startswith(b"data:") or (payload := line[5:].strip()) == b"[DONE]":
            continue
        error = error_object(payload)
        if error is None:
            return None
        code = error.get("code")
        if isinstance(code, int) and not isinstance(code, bool):
            if code < 500:
                return None
        elif str(error.get("type", "")).lower() in CLIENT_ERROR_TYPES:
            return None
        return str(error.get("message", "")).encode("utf-8", "replace")
    return None


def engine_dead_reason(body: bytes) -> str | None:
    """The engine-dead marker found in an error answer's first 64 KiB (decoded), or None."""
    found = _ENGINE_DEAD.search(body, 0, ERROR_BODY_LIMIT)
    return None if found is None else found.group(0).decode("ascii", "replace")


@dataclass(slots=True)
class DeathEvent:
    """One death of one backend: why (``signal``), when (monotonic seconds), the attempts
    in flight there then (attempt id -> ``(fingerprint, endpoint)``) and whether an answer
    said the engine died (``confirmed``; else the process vanished)."""

    backend: str
    signal: str
    at: float
    participants: dict[int, tuple[str, str]] = field(default_factory=dict)
    confirmed: bool = False


@dataclass(frozen=True, slots=True)
class Death:
    """The verdict on a failed attempt whose backend died: the event, whether the attempt
    was a participant (then it must not fail over), whether its fingerprint is now
    quarantined, and whether it is a suspect (struck, not yet quarantined)."""

    event: DeathEvent
    participant: bool
    quarantined: bool
    suspect: bool = False

    @property
    def unblamed(self) -> bool:
        """The death blames nobody: no engine error and several requests in flight (the
        process killed from outside, :mod:`gateway.upstream.quarantine`'s rule), so a
        participant may fail over once (:meth:`~gateway.upstream.attempt.Attempt.contained`)."""
        return not self.event.confirmed and len(self.event.participants) > 1


class DeathWatch:
    """Attempts in flight per backend, death events and attribution (module docstring).

    ``client`` probes ``/health`` (the app's shared httpx client); ``registry`` holds the
    backend states marked on a death; ``table`` receives the participants' fingerprints.
    Owned by the event loop (no locking).
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        registry: BackendRegistry,
        table: QuarantineTable,
        *,
        probe_timeout_s: float,
        min_event_s: float = 5.0,
    ) -> None:
        self.client, self.registry, self.table = client, registry, table
        self.probe_timeout_s, self.min_event_s = probe_timeout_s, min_event_s
        self._ids = itertools.count(1)
        self._inflight: dict[str, dict[int, tuple[str, Mapping[str, Any]]]] = {}
        self._events: dict[str, DeathEvent] = {}  # open events
        self._probes: dict[str, asyncio.Future[bool]] = {}  # one /health probe per backend
        self.last: dict[str, DeathEvent] = {}  # each backend's last death, for the admin view
        self.deaths: dict[str, int] = {}

    def begin(self, backend: str, endpoint: str, body: Mapping[str, Any]) -> int:
        """Register an attempt in flight to ``backend``; returns its id for :meth:`end`."""
        attempt = next(self._ids)
        self._inflight.setdefault(backend, {})[attempt] = (endpoint, body)
        return attempt

    def end(self, backend: str, attempt: int) -> None:
        """The attempt is over (idempotent)."""
        self._inflight.get(backend, {}).pop(attempt, None)

    def open_event(self, backend: str) -> DeathEvent | None:
        """The backend's death event while it is open (the backend not healthy since)."""
        event = self._events.get(backend)
        if event is None:
            return None
        state = self.registry.states.get(backend)
        if time.monotonic() - event.at < self.min_event_s or (state and state.healthy is not True):
            return event
        del self._events[backend]
        return None

    def event_of(self, backend: str, attempt: int) -> DeathEvent | None:
        """The death event ``attempt`` belongs to: the backend's open event, or its last one
        when the attempt was in flight at it (a participant failing late)."""
        last = self.last.get(backend)
        if last is not None and attempt in last.participants:
            return last
        return self.open_event(backend)

    async def check(
        self, backend: str, base_url: str, attempt: int, signal: str, *, confirmed: bool
    ) -> Death | None:
        """Did ``backend`` die under ``attempt``? ``signal`` says how the attempt failed (for
        logs and /routes, never request content); ``confirmed``: the answer itself said the
        engine is dead (no probe). Returns None for an ordinary failure."""
        event = self.event_of(backend, attempt)
        if event is None:
            if not confirmed and not await self._probe(backend, base_url):
                return None
            # another attempt may have opened the event while this one awaited the probe
            event = self.event_of(backend, attempt) or self._new_event(backend, signal, confirmed)
        if confirmed and not event.confirmed:
            event.confirmed, event.signal = True, signal
            self._blame(event)
        participant = attempt in event.participants
        quarantined = suspect = False
        if participant:
            entry = self.table.entry(event.participants[attempt][0])
            quarantined = entry is not None and entry.quarantined_until is not None
            suspect = entry is not None and not quarantined
        return Death(event, participant, quarantined, suspect)

    async def _probe(self, backend: str, base_url: str) -> bool:
        """Whether ``backend`` is dead, by one ``/health`` probe shared by every attempt
        asking at the same time (a waiter cancelled does not cancel it)."""
        probe = self._probes.get(backend)
        if probe is None:
            probe = self._probes[backend] = asyncio.ensure_future(self._dead(base_url))
            probe.add_done_callback(lambda done: self._forget_probe(backend, done))
        return await asyncio.shield(probe)

    def _forget_probe(self, backend: str, probe: asyncio.Future[bool]) -> None:
        if self._probes.get(backend) is probe:
            del self._probes[backend]

    async def _dead(self, base_url: str) -> bool:
        try:
            response = await self.client.get(f"{base_url}/health", timeout=self.probe_timeout_s)
        except httpx.TimeoutException:
            return False  # slow, not gone: an ordinary failure
        except httpx.HTTPError:
            return True  # refused or reset: the server is gone
        return response.status_code != 200

    def _new_event(self, backend: str, signal: str, confirmed: bool) -> DeathEvent:
        now = time.monotonic()
        event = DeathEvent(backend, signal, now, confirmed=confirmed)
        for attempt, (endpoint, body) in self._inflight.get(backend, {}).items():
            event.participants[attempt] = (fingerprint(endpoint, body), endpoint)
        self._events[backend] = self.last[backend] = event
        self.deaths[backend] = self.deaths.get(backend, 0) + 1
        state = self.registry.states.get(backend)
        if state is not None:
            state.mark(False)  # attempts waiting there give up
            state.last_error = f"died: {signal}"
        self._blame(event)
        return event

    def _blame(self, event: DeathEvent) -> None:
        """Judge the event's participants (the table's rule) and log the verdict."""
        newly = self.table.record(
            list(event.participants.values()),
            event.backend,
            event.signal,
            confirmed=event.confirmed,
            at=event.at,
        )
        logger.warning(
            "backend %s died (%s, %s) with %d request(s) in flight; %s",
            event.backend,
            event.signal,
            "engine error" if event.confirmed else "no engine error",
            len(event.participants),
            ", ".join(
                f"fingerprint {e.fingerprint} quarantined for {self.table.ttl_s:g} s" for e in newly
            )
            or "nothing quarantined",
        )

    def to_json(self) -> dict[str, Any]:
        """Deaths per backend and each backend's last death (seconds ago)."""
        now = time.monotonic()
        last = {
            name: {
                "signal": e.signal,
                "ago_s": round(now - e.at, 1),
                "in_flight": len(e.participants),
            }
            for name, e in self.last.items()
        }
        return {"deaths": dict(self.deaths), "last": last}
