"""Requests that arrive together are routed as the burst they are.

A wave of c requests sent at once reaches the gateway within milliseconds, but one event
loop takes them in turn (0.4-1.0 ms each: docs/benchmarks.md section 7, "Seventh run"), so
the first is routed before the others are read. Routed alone, it meets idle servers and
goes where a lone request is fastest (EAGLE-3 for code); the rest follow it until its
batch passes ``max_batch_for_speculation`` x ``LEADER_SLACK`` and then go to plain: the
wave splits over two servers time-slicing one GPU, slower than either alone (the first
c=16 wave of 6 of 20 gateway runs on the GPU twin, 0.89-0.93x plain against 0.95-1.01;
the simulator's first c=32 wave, 0.68x; section 7, "Eleventh run").

:class:`Arrivals` counts, per model, the requests that entered routing and are not routed
yet. A request arriving after a quiet spell (nothing of this gateway's in flight for its
model, and no large burst there over the last 10-20 s: :meth:`Gateway.quiet
<gateway.service.Gateway.quiet>`) forms a *cohort*: it lets the event loop turn until no new
request of the model has entered for :data:`QUIET_TURNS` turns (what the kernel already holds
is read; nothing is waited for on the clock), at most :data:`MAX_FORMING_S`, or until the
policy's cap (:meth:`~gateway.routing.policy.RoutingPolicy.cohort_cap`) have entered.
Requests entering meanwhile wait for it, up to the cap; past it the burst is known to be
large and they are routed at once, seeing it as load. Then the first is routed, seeing the
others as load (``arriving``) and, under an adaptive rule, choosing for the cohort's mix of
tasks (:meth:`Arrivals.members`; the policy's ``cohort``), and they follow, seeing it in
flight.

Cost: a lone request pays three loop turns (~12 us on an idle loop; more when the loop is
busy with other models' requests); requests arriving under load never wait. A task waiting
on the loop runs only after the turn in progress, and one turn can read and prepare a whole
wave (uvicorn reads every ready connection, then runs their handlers), so a cohort's requests
can wait that long (the forming request checks the clock and the cap once a turn): on the
simulated fleet at c=256 without the cap on joining and the recent-peak check, the first
token came ~250 real ms later (docs/benchmarks.md section 7b, session 23). Cohorts are per
gateway process: behind several workers or replicas each sees its own part of a wave.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

#: What a request entering routing leaves for its cohort's first request to read (the
#: gateway's: its features and prompt statistics).
M = TypeVar("M")

#: Event-loop turns without a new arrival that end a cohort's forming. Three: a request the
#: kernel holds is read in one turn (uvicorn's ``data_received``), its handler runs to the
#: routing step in the next, and the forming request's own turn comes first in each.
QUIET_TURNS = 3
#: The longest a cohort forms, seconds: a wave the loop takes in at ~1 ms a request is
#: seen up to about ten (enough to pass a speculative backend's batch limit x 2 of the
#: shipped configs) before its first request goes.
MAX_FORMING_S = 0.010


class Arrivals(Generic[M]):
    """Per served model: requests that entered routing and are not routed yet (each with
    what it left, a member of type ``M``), and the cohort forming (see the module
    docstring). Owned by the gateway (one event loop); no locking."""

    __slots__ = ("forming", "cohorts", "waiting")

    def __init__(self) -> None:
        self.forming: dict[str, asyncio.Event] = {}
        #: Per model, the members entered and not routed yet, in order of entry.
        self.waiting: dict[str, list[M]] = {}
        #: Cohorts of two or more requests formed since start, and the requests they held
        #: (``/routes``).
        self.cohorts: Counter[str] = Counter()

    @property
    def entered(self) -> dict[str, int]:
        """Per model, the requests entered and not routed yet (none: absent)."""
        return {model: len(waiting) for model, waiting in self.waiting.items()}

    @contextmanager
    def enter(self, model: str, member: M) -> Iterator[None]:
        """Count one request of ``model`` as arriving until it is routed (the block's end),
        with ``member`` among :meth:`members` meanwhile."""
        self.waiting.setdefault(model, []).append(member)
        try:
            yield
        finally:  # by identity: members alike may compare equal
            waiting = self.waiting[model]
            del waiting[next(i for i, m in enumerate(waiting) if m is member)]
            if not waiting:
                del self.waiting[model]

    def members(self, model: str) -> list[M]:
        """The members of the requests of ``model`` entered and not routed yet, in order of
        entry (a copy)."""
        return list(self.waiting.get(model, ()))

    def arriving(self, model: str) -> int:
        """Requests of ``model`` entered and not routed yet, the caller's own included."""
        return len(self.waiting.get(model, ()))

    async def settle(self, model: str, cap: int) -> bool:
        """Wait, inside :meth:`enter`, until this request may be routed: after the forming
        cohort's first request when one of ``model`` is forming, else form one (module
        docstring) until ``cap`` requests have entered (the policy can tell no more from a
        larger one). The caller enters only after a quiet spell
        (:meth:`~gateway.service.Gateway.quiet`) or while a cohort forms with fewer than
        ``cap`` entered. Cancellation ends a cohort's forming for the others. Returns True
        for the request that formed the cohort (routed first, for the cohort), False for
        one that joined it."""
        event = self.forming.get(model)
        if event is not None:
            await event.wait()
            return False
        event = self.forming[model] = asyncio.Event()
        loop = asyncio.get_running_loop()
        try:
            deadline, seen, quiet = loop.time() + MAX_FORMING_S, self.arriving(model), 0
            while quiet < QUIET_TURNS and seen < cap and loop.time() < deadline:
                await asyncio.sleep(0)
                now = self.arriving(model)
                quiet, seen = (quiet + 1, seen) if now == seen else (0, now)
            if seen > 1:
                self.cohorts["formed"] += 1
                self.cohorts["requests"] += seen
        finally:
            del self.forming[model]
            event.set()  # the waiters run after this request's routing step (no await there)
        return True
