"""One try of one backend, as the forwarder sees it: the backend lease (its in-flight slot)
and the registration with the :class:`~gateway.upstream.deaths.DeathWatch` (containment)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.failures import BackendDied
from gateway.upstream.client import UpstreamBroken
from gateway.upstream.deaths import ERROR_BODY_LIMIT, Death, DeathWatch, engine_dead_reason
from gateway.upstream.state import BackendState


@dataclass(slots=True)
class Attempt:
    """Backend ``name`` at ``base_url`` with its live ``state``: a lease on the backend from
    :meth:`begin` to :meth:`end` (idempotent), which holds one of its in-flight slots and
    the ``watch``'s registration (None: no containment; the attempt is known as ``token``).
    ``held``: the lease is taken and not yet ended. ``survived``: the backend died under
    the attempt, blaming nobody, and the request moves on (:meth:`contained`)."""

    name: str
    base_url: str
    state: BackendState
    watch: DeathWatch | None
    token: int = 0
    held: bool = False
    survived: bool = False

    def begin(self, endpoint: str, body: Mapping[str, Any] | None) -> None:
        """Take the backend's in-flight slot and register the attempt in flight (``body``:
        the parsed request; None: not watched)."""
        if self.watch is not None and body is not None:
            self.token = self.watch.begin(self.name, endpoint, body)
        self.state.take(time.monotonic())
        self.held = True

    def end(self) -> None:
        """The attempt is over: the slot is given back and the registration dropped (only
        the first call does anything)."""
        if not self.held:
            return
        self.held = False
        if self.watch is not None and self.token:
            self.watch.end(self.name, self.token)
        self.state.release()

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


async def read_head(chunks: AsyncIterator[bytes]) -> tuple[list[bytes], bool]:
    """Read an error answer's first chunks, up to about 64 KiB or its end; returns them and
    whether the body broke off (reset, timeout) meanwhile."""
    head: list[bytes] = []
    size = 0
    try:
        while size < ERROR_BODY_LIMIT:
            chunk = await anext(chunks, None)
            if chunk is None:
                break
            head.append(chunk)
            size += len(chunk)
    except UpstreamBroken:
        return head, True
    return head, False
