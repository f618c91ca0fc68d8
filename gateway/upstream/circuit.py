"""A per-backend circuit breaker: closed, open for a cool-down, then one half-open probe.

After ``failure_threshold`` consecutive request failures (connect errors, resets, 502/503,
timeouts before the first byte) the circuit opens: routing skips the backend for
``cooldown_s`` seconds. Then one request may probe it (half-open): success closes the
circuit, failure opens it again. Times are ``time.monotonic()`` seconds passed in by callers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

CircuitState = Literal["closed", "open", "half_open"]


@dataclass(slots=True)
class CircuitBreaker:
    """Consecutive-failure circuit breaker for one backend (see the module docstring)."""

    failure_threshold: int = 5
    cooldown_s: float = 10.0
    failures: int = 0
    opened_at: float | None = None
    probing: bool = False
    opened_count: int = 0

    def state(self, now: float) -> CircuitState:
        """``closed``, ``open`` (cooling down) or ``half_open`` (a probe may go)."""
        if self.opened_at is None:
            return "closed"
        return "open" if now - self.opened_at < self.cooldown_s else "half_open"

    def routable(self, now: float) -> bool:
        """True when a request may be sent: closed, or half-open with no probe under way."""
        state = self.state(now)
        return state == "closed" or (state == "half_open" and not self.probing)

    def on_attempt(self, now: float) -> None:
        """A request is being sent; in half-open state it becomes the probe."""
        if self.state(now) == "half_open":
            self.probing = True

    def on_success(self) -> None:
        """The backend answered (any status but 502/503): close the circuit."""
        self.failures, self.opened_at, self.probing = 0, None, False

    def on_failure(self, now: float) -> None:
        """The backend failed before answering; open the circuit at the threshold, or
        again at once after a failed probe."""
        self.failures += 1
        if self.probing or self.failures >= self.failure_threshold:
            if self.opened_at is None or self.probing:
                self.opened_count += 1
            self.opened_at, self.probing = now, False
