"""A burst's prepare stages spread over turns of the event loop, so its upstream requests
leave as they are decided instead of all after the last one is.

A burst's requests become ready in the same turn of the loop, and asyncio runs every ready
callback of a turn before it polls sockets again. Each request's prepare stage (parse,
classify, decide: ~0.4 ms) ran back to back for the whole burst. Anything its upstream
request then waited for was answered only after the burst's last prepare: connecting to
the backend when no pooled connection was idle (the pool keeps one 4 s), and on Python <
3.12 aiohttp's writing of the request body, a task of its own (3.12+ starts it eagerly, so
there only a cold pool waits). Against ``bench.fake_upstream --first-token-delay-ms 50``
(waves of 64 at once, ``bench.wave_probe`` with ``bench.wave_marks``, Python 3.11): the 33rd
request of a wave was decided 16 ms after the first entered, and its first token came 83 ms
after, not 66 (docs/benchmarks.md section 7, "Session 19 on this machine").

:class:`Turns` admits one request a turn, so each request connects and sends a prepare or so
after its own (the poll's completions run after the next admitted request), not after the
whole burst's; and every request that has waited :data:`MAX_WAIT_S` at once, so when every
turn also relays many streams intake is delayed by about that at most. A lone request
passes at once. Measured figures: the section above.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

#: The longest a request waits for its turn (seconds): past it, every request that waited
#: that long is admitted at the next turn. Longer than a burst of 64 takes to prepare on the
#: GPU host (0.5-1.0 ms each), so such a burst is admitted one a turn; when every turn also
#: relays many streams (turns of milliseconds), intake is delayed by at most this.
MAX_WAIT_S = 0.05


class Turns:
    """Admits requests to their prepare stage one per turn of the running event loop, FIFO,
    and any that waited :data:`MAX_WAIT_S` at once.

    ``async with turns.take():`` enters at once when nobody entered in this turn and nobody
    waits; else it waits, and a callback at the next turn (after the loop polled its
    sockets) admits the first waiter and every one that waited ``max_wait_s`` (seconds, on
    ``clock``); their tasks then run in the turn after that. Nothing is held for the block:
    admission only spaces the entries. Cancellation while waiting leaves the queue
    consistent. Not thread-safe: one event loop, for the life of the app (a callback left
    pending by a stopped loop would keep it shut).
    """

    def __init__(
        self, max_wait_s: float = MAX_WAIT_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_wait_s, self._clock = max_wait_s, clock
        self._taken = False  # a holder was admitted for the current turn
        self._waiters: deque[tuple[float, asyncio.Future[None]]] = deque()  # (since, future)
        self._scheduled = False  # a _next_turn callback is pending

    @asynccontextmanager
    async def take(self) -> AsyncIterator[None]:
        """Enter the block in a turn (see the class docstring)."""
        if self._waiters or self._taken:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append((self._clock(), waiter))
            self._schedule()
            await waiter  # admitted by _next_turn
        else:
            self._taken = True
            self._schedule()
        yield

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        """A new turn: admit the first waiter and every overdue one (cancelled ones
        skipped)."""
        self._scheduled = False
        self._taken = False
        overdue = self._clock() - self.max_wait_s
        while self._waiters and (not self._taken or self._waiters[0][0] <= overdue):
            _, waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._taken = True
        if self._taken:
            self._schedule()
