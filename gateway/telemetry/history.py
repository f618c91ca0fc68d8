"""A bounded in-memory history of each backend's acceptance, for the status page's chart."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from gateway.upstream.state import BackendRegistry


class AcceptanceHistory:
    """Per backend, the last ``span_s`` seconds of ``(unix time, acceptance rate)`` samples.

    :meth:`sample` reads the registry's current windowed acceptance (backends without a
    measured window are skipped); the app calls it every ``interval_s`` seconds. Each deque
    holds at most ``span_s / interval_s + 1`` samples (capped at ``max_points``).
    """

    def __init__(
        self,
        registry: BackendRegistry,
        *,
        span_s: float = 600.0,
        interval_s: float = 2.0,
        max_points: int = 2000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry
        self.span_s = span_s
        self.interval_s = interval_s
        self.clock = clock
        self.maxlen = max(2, min(max_points, int(span_s / interval_s) + 1))
        self.series: dict[str, deque[tuple[float, float]]] = {}

    def sample(self) -> None:
        """Append each backend's current acceptance rate; forget removed backends."""
        now = self.clock()
        states = self.registry.states
        self.series = {n: s for n, s in self.series.items() if n in states}
        for name, state in states.items():
            if state.acceptance is None:
                continue
            series = self.series.setdefault(name, deque(maxlen=self.maxlen))
            series.append((now, state.acceptance.rate))

    def recent(self, name: str) -> list[tuple[float, float]]:
        """The samples of ``name`` within the last ``span_s`` seconds, oldest first."""
        start = self.clock() - self.span_s
        return [(t, r) for t, r in self.series.get(name, ()) if t >= start]
