"""One try of one backend, as the forwarder sees it: the backend lease (its in-flight slot),
the registration with the :class:`~gateway.upstream.deaths.DeathWatch` (containment), and
giving up the wait for an answer when the backend is marked down
(:meth:`Attempt.given_up_when_down`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from gateway.failures import BackendDied
from gateway.upstream.client import UpstreamBroken, UpstreamDropped
from gateway.upstream.deaths import ERROR_BODY_LIMIT, Death, DeathWatch, engine_dead_reason
from gateway.upstream.state import BackendState


@dataclass(slots=True)
class Attempt:
    """Backend ``name`` at ``base_url`` with its live ``state``: a lease on the backend from
    :meth:`begin` to :meth:`end` (idempotent), which holds one of its in-flight slots and
    the ``watch``'s registration (None: no containment; the attempt is known as ``token``).
    ``held``: the lease is taken and not yet ended; ``started``: when it was taken
    (``time.monotonic()``). ``generation``: a routed generation's attempt, counted in the
    backend's :attr:`~gateway.upstream.state.BackendState.taken` and ``ended`` (a
    pass-through one, ``/tokenize`` say, holds no GPU batch slot). ``survived``: the backend
    died under the attempt, blaming nobody, or its non-streamed answer broke off, and the
    request moves on (:meth:`contained`; once per request)."""

    name: str
    base_url: str
    state: BackendState
    watch: DeathWatch | None
    generation: bool = False
    token: int = 0
    held: bool = False
    survived: bool = False
    started: float = 0.0

    def begin(self, endpoint: str, body: Mapping[str, Any] | None) -> None:
        """Take the backend's in-flight slot and register the attempt in flight (``body``:
        the parsed request; None: not watched)."""
        if self.watch is not None and body is not None:
            self.token = self.watch.begin(self.name, endpoint, body)
        self.started = time.monotonic()
        self.state.take(self.started, counted=self.generation)
        self.held = True

    def end(self, *, answered: bool = False) -> None:
        """The attempt is over: the slot is given back and the registration dropped (only
        the first call does anything). ``answered``: the backend gave a whole 200 answer,
        so how long it held the request is timed (:meth:`BackendState.release`); failures,
        refusals and clients that left are not, so their short times do not age scrapes."""
        if not self.held:
            return
        self.held = False
        if self.watch is not None and self.token:
            self.watch.end(self.name, self.token)
        self.state.release(
            time.monotonic() - self.started if answered else None, counted=self.generation
        )

    async def died(self, signal: str, head: bytes = b"") -> Death | None:
        """Whether the backend died under this attempt, which failed as ``signal`` says;
        ``head``: the start of the error answer (an engine-dead marker there confirms the
        death without a probe). None when not watched or an ordinary failure."""
        if self.watch is None or not self.token:
            return None
        reason = engine_dead_reason(head) if head else None
        if reason is not None:
            signal = f"{signal}: {reason}"
        return await self.watch.check(
            self.name, self.base_url, self.token, signal, confirmed=reason is not None
        )

    def contained(self, death: Death | None, *, may_survive: bool) -> BackendDied | None:
        """What a participant of ``death`` fails with (:meth:`died_failure`), unless the
        death blames nobody and ``may_survive`` (the request survived no death yet): then
        None, and the attempt is marked ``survived`` (it fails over as an ordinary failure).
        None too for no death, or not a participant."""
        if death is None or not death.participant:
            return None
        if may_survive and death.unblamed:
            self.survived = True
            return None
        return self.died_failure(death)

    def given_up_when_down(self) -> GiveUpWhenDown:
        """A ``with`` block around a wait for this backend (its headers, an answer's head or
        whole body) that the backend being found down
        (:meth:`BackendState.mark <gateway.upstream.state.BackendState.mark>`: by the health
        poller, or a death) ends at once with :class:`MarkedDown`; see
        :class:`GiveUpWhenDown`."""
        return GiveUpWhenDown(self)

    async def read_head(
        self, chunks: AsyncIterator[bytes], limit: float = ERROR_BODY_LIMIT
    ) -> tuple[list[bytes], str | None]:
        """Read an answer's first ``chunks``, up to about ``limit`` bytes (default 64 KiB;
        ``math.inf``: the whole body) or its end; returns them, and why the body broke off
        meanwhile (a reset, a timeout, the backend marked down) or None. Raises nothing of
        the backend's."""
        head: list[bytes] = []
        size = 0
        try:
            with self.given_up_when_down():
                while size < limit:
                    chunk = await anext(chunks, None)
                    if chunk is None:
                        break
                    head.append(chunk)
                    size += len(chunk)
        except (UpstreamBroken, MarkedDown) as exc:
            return head, str(exc)
        return head, None

    def died_failure(self, death: Death) -> BackendDied:
        """What a participant of ``death`` fails with (answered 500 ``backend_died``)."""
        ttl_s = self.watch.table.ttl_s if self.watch is not None else 0.0
        return BackendDied(
            self.name,
            death.event.signal,
            blame="quarantined" if death.quarantined else "suspect" if death.suspect else "none",
            in_flight=len(death.event.participants),
            ttl_s=ttl_s,
        )


class MarkedDown(UpstreamDropped):
    """The backend was found down while an attempt waited for it: given up, as a dropped
    connection is (before the answer's headers the request moves on; an answer being read
    in the attempt, :meth:`Attempt.read_head`, ends as one that broke off)."""


class GiveUpWhenDown:
    """Cancels the task in the block when the attempt's backend is marked down, and turns
    that cancellation into :class:`MarkedDown` (as ``asyncio.timeout`` turns its own into
    ``TimeoutError``): a waiter on the backend's
    :attr:`~gateway.upstream.state.BackendState.down_listeners` while the block runs, no
    polling. Any other cancellation (the client left, shutdown) goes on as it is. Must be
    entered in the task that waits, once: each wait takes its own."""

    __slots__ = ("_attempt", "_listener", "_task", "_cancelling", "_fired")

    def __init__(self, attempt: Attempt) -> None:
        self._attempt = attempt
        self._listener = self._give_up  # one bound method: added and discarded as itself
        self._fired = False

    def __enter__(self) -> None:
        task = asyncio.current_task()
        assert task is not None, "entered outside a task"
        self._task, self._cancelling = task, task.cancelling()
        self._attempt.state.down_listeners.add(self._listener)

    def _give_up(self) -> None:
        if not self._fired:
            self._fired = True
            self._task.cancel()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._attempt.state.down_listeners.discard(self._listener)
        if self._fired and self._task.uncancel() <= self._cancelling:
            if exc_type is not None and issubclass(exc_type, asyncio.CancelledError):
                why = self._attempt.state.last_error  # ours alone: the backend went down
                raise MarkedDown(f"the backend was marked down ({why or 'unhealthy'})") from None
