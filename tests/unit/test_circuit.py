"""The circuit breaker's states over a recorded sequence of outcomes."""

from __future__ import annotations

from gateway.upstream.circuit import CircuitBreaker


def test_opens_after_threshold_then_half_open_probe_closes_it() -> None:
    cb = CircuitBreaker(failure_threshold=3, cooldown_s=10)
    for t in (0.0, 1.0):
        cb.on_failure(t)
        assert cb.state(t) == "closed"
    cb.on_failure(2.0)
    assert cb.state(2.0) == "open" and not cb.routable(5.0)
    assert cb.state(12.0) == "half_open" and cb.routable(12.0)
    cb.on_attempt(12.0)
    assert not cb.routable(12.1)  # one probe at a time
    cb.on_success()
    assert cb.state(12.2) == "closed" and cb.failures == 0
    assert cb.opened_count == 1


def test_failed_probe_reopens_for_a_full_cooldown() -> None:
    cb = CircuitBreaker(failure_threshold=1, cooldown_s=5)
    cb.on_failure(0.0)
    cb.on_attempt(6.0)
    cb.on_failure(6.5)
    assert cb.state(10.0) == "open"
    assert cb.state(11.6) == "half_open"
    assert cb.opened_count == 2


def test_success_resets_the_count() -> None:
    cb = CircuitBreaker(failure_threshold=2)
    cb.on_failure(0.0)
    cb.on_success()
    cb.on_failure(1.0)
    assert cb.state(1.0) == "closed"
