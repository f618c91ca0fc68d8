"""One request's prepare stage per turn of the event loop, so a burst's upstream requests
leave as they are decided instead of all after the last one is.

A burst's requests become ready in the same turn of the loop, and asyncio runs every ready
callback of a turn before it polls sockets again. Each request's prepare stage (parse,
classify, decide: ~0.4 ms) ran back to back for the whole burst. Anything its upstream
request then waited for was answered only after the burst's last prepare: connecting to
the backend when no pooled connection was idle (its pool keeps one 4 s), and on Python < 3.12
aiohttp's writing of the request body, a task of its own. Measured against
``bench.fake_upstream --first-token-delay-ms 50`` (waves of 64 at once, ``bench.wave_probe``
with ``bench.wave_marks``): request 32 of a wave was decided 16 ms after the first entered,
and its first token came 83 ms after, not 68 (docs/benchmarks.md section 7, "Tenth run").

:class:`Turns` lets one request prepare in a turn of the loop; the next prepares in the turn
after, once the loop has polled, so the request decided before has connected and sent. A
lone request passes at once. Measured on the same fake, waves of 64 (targets interleaved):
first token p50 105 -> 89 ms with the backend's pool warm, 127 -> 103 ms with it cold (waves
4.5 s apart); four prepares a turn kept less of that (91 and 112 ms). With the gateway
itself saturated (a fake answering at once, 128 streams): the same requests a second and
end-to-end time, the first chunk ~25 ms later (p50), the streams already started being
relayed first.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class Turns:
    """Admits one holder per turn of the running event loop, FIFO.

    ``async with turns.take():`` returns at once when nobody entered in this turn and nobody
    waits; else it waits, and a callback at the next turn (after the loop polled its
    sockets) admits the next waiter, whose task then runs in the turn after that.
    Cancellation while waiting leaves the queue consistent. Not thread-safe: one event loop.
    """

    def __init__(self) -> None:
        self._taken = False  # a holder was admitted for the current turn
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._scheduled = False  # a _next_turn callback is pending

    @asynccontextmanager
    async def take(self) -> AsyncIterator[None]:
        """Hold a place in a turn for the block (see the class docstring)."""
        if self._waiters or self._taken:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            self._schedule()
            await waiter  # admitted (counted in _taken) by _next_turn
        else:
            self._taken = True
            self._schedule()
        yield

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        """A new turn: admit the first waiter not cancelled, if any."""
        self._scheduled = False
        self._taken = False
        while self._waiters and not self._taken:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._taken = True
        if self._taken:
            self._schedule()
