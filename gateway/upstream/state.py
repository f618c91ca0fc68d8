"""Live per-backend state shared by the poller, the forwarder and the admin API."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from gateway.routing.acceptance import AcceptanceStats, AcceptanceWindow
from gateway.routing.policy import BackendSnapshot


@dataclass(slots=True)
class BackendState:
    """Mutable live state of one backend (owned by the event loop; no locking needed).

    ``healthy`` is the last health probe's verdict (``None`` before the first probe, routed
    as healthy so a fresh gateway does not refuse traffic); ``inflight`` counts this
    gateway's requests currently sent to the backend; ``running``, ``waiting`` and
    ``kv_cache_usage`` come from the last ``/metrics`` scrape; ``acceptance`` is the
    windowed acceptance of a speculative backend; ``demotions`` counts how often it fell
    under its acceptance floor.
    """

    healthy: bool | None = None
    inflight: int = 0
    last_error: str | None = None
    last_checked: float | None = None
    running: float = 0.0
    waiting: float = 0.0
    kv_cache_usage: float = 0.0
    last_scrape: float | None = None
    window: AcceptanceWindow = field(default_factory=AcceptanceWindow)
    acceptance: AcceptanceStats | None = None
    demoted: bool = False
    demotions: int = 0

    def snapshot(self) -> BackendSnapshot:
        """The immutable view the routing policy reads."""
        return BackendSnapshot(
            healthy=self.healthy is not False,
            inflight=self.inflight,
            running=self.running,
            waiting=self.waiting,
            demoted=self.demoted,
            acceptance_rate=self.acceptance.rate if self.acceptance else None,
        )


@dataclass(slots=True)
class DecisionStats:
    """Counts of routing outcomes since start: per rule, per task, per serving backend."""

    by_rule: Counter[str] = field(default_factory=Counter)
    by_task: Counter[str] = field(default_factory=Counter)
    by_backend: Counter[str] = field(default_factory=Counter)
    failovers: int = 0
    rejected: int = 0


class BackendRegistry:
    """The set of backends' live states, keyed by backend name.

    :meth:`sync` follows a config change: new backends get a fresh state, removed ones are
    dropped, kept ones keep their counters and windows.
    """

    def __init__(self, names: Iterable[str]) -> None:
        self.states: dict[str, BackendState] = {}
        self.sync(names)

    def sync(self, names: Iterable[str]) -> None:
        """Make the registry hold exactly ``names``."""
        wanted = list(names)
        self.states = {n: self.states.get(n) or BackendState() for n in wanted}

    def snapshot(self) -> dict[str, BackendSnapshot]:
        """Every backend's :class:`BackendSnapshot`, for one routing decision."""
        return {name: state.snapshot() for name, state in self.states.items()}
