"""The routing policy: from request features and live backend state to an ordered try list.

Pure code: no HTTP, no I/O, no clock. Randomness (tie breaks) comes from the caller's
``random.Random`` so a decision is deterministic for a given state and seed.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.config import GatewayConfig
from gateway.routing.features import RequestFeatures
from gateway.routing.rules import first_match

DEFAULT_RULE = "default"


@dataclass(frozen=True, slots=True)
class BackendSnapshot:
    """A backend's live state as routing sees it: health and outstanding requests."""

    healthy: bool
    inflight: int = 0


@dataclass(frozen=True, slots=True)
class Candidate:
    """One backend considered for a request: kept in the try list or not, and why."""

    backend: str
    pool: str
    kept: bool
    why: str


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """The outcome of routing one request.

    ``backends`` is the ordered try list (the first is the choice, the rest are failover
    targets, used only before any byte reaches the client); ``candidates`` lists every backend
    considered with the reason it was kept or skipped; ``reasons`` explains the rule choice.
    """

    rule: str
    pool: str
    features: RequestFeatures
    backends: tuple[str, ...]
    candidates: tuple[Candidate, ...]
    reasons: tuple[str, ...] = field(default=())

    @property
    def backend(self) -> str | None:
        """The chosen backend, or None when no candidate is usable."""
        return self.backends[0] if self.backends else None


class RoutingPolicy:
    """Decides, for one request, the rule, the pool and the ordered backends to try.

    Order: the matched rule's pool, then its fallback pools, then (when nothing matched)
    the default pool. Within a pool: healthy backends serving the requested model, least
    outstanding requests first, ties broken at random.
    """

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config

    def decide(
        self,
        features: RequestFeatures,
        state: Mapping[str, BackendSnapshot],
        rng: random.Random,
    ) -> RouteDecision:
        """Route one request. Never raises for a valid config; an empty ``backends`` means
        no usable backend (the caller answers 503). Unknown backends count as unhealthy."""
        rule = first_match(self.config.rules, features)
        if rule is None:
            rule_name, pools = DEFAULT_RULE, [self.config.defaults.pool]
            reasons = ["no rule matched: default pool"]
        else:
            rule_name, pools = rule.name, [rule.pool, *rule.fallbacks]
            reasons = [
                f"rule '{rule.name}' matched (task={features.task}, "
                f"temperature={features.temperature:g})"
            ]
        order: list[str] = []
        candidates: list[Candidate] = []
        for pool in pools:
            kept: list[tuple[int, float, str]] = []
            for name in self.config.pools.get(pool, []):
                why = self._skip_reason(name, features, state, order)
                if why is not None:
                    candidates.append(Candidate(name, pool, False, why))
                    continue
                inflight = state[name].inflight
                kept.append((inflight, rng.random(), name))
                candidates.append(Candidate(name, pool, True, f"healthy, {inflight} in flight"))
            order.extend(name for _, _, name in sorted(kept))
        return RouteDecision(
            rule=rule_name,
            pool=pools[0],
            features=features,
            backends=tuple(order),
            candidates=tuple(candidates),
            reasons=tuple(reasons),
        )

    def _skip_reason(
        self,
        name: str,
        features: RequestFeatures,
        state: Mapping[str, BackendSnapshot],
        order: list[str],
    ) -> str | None:
        backend = self.config.backends.get(name)
        snap = state.get(name)
        if backend is None or snap is None:
            return "unknown backend"
        if name in order:
            return "already a candidate from an earlier pool"
        if backend.served_model != features.model:
            return f"serves model '{backend.served_model}', not '{features.model}'"
        if not snap.healthy:
            return "unhealthy"
        return None
