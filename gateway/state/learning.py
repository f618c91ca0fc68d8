"""The fleet's adaptive estimates: this replica's own, plus the sum of its peers'.

Each replica learns alone in its :class:`~gateway.routing.adaptive.Learner` (what it saves to
its own file and publishes under its own key) and routes on the merge of that with the last
published state of every peer. Merging is exact for independent samples: per (task, bucket,
backend), decayed weights, draft counts, tokens and seconds add, and the weighted means and
sums of squared deviations of ln(tokens/s) combine by Chan, Golub and LeVeque's pairwise
formula ("Updating formulae and a pairwise algorithm for computing sample variances", 1979):
``M2 = sum(M2_i + w_i (mean_i - mean)^2)`` with ``mean = sum(w_i mean_i) / sum(w_i)``. Each
side is aged to its own group's count first (each replica's decay runs on its own
observations); the merged group's count is the sum of the counts and every merged entry is
current (``at == count``), so routing reads it as it reads a local group. A peer's state of
version 4 or older has no tokens or seconds: merged with one that has them, it adds its
weight but not its speed (while a rolling upgrade runs; alone, it is read at its mean).

Publishing each replica's own state (rather than adding deltas into one shared record) makes
a publication idempotent: a replica that publishes twice, restarts, or comes back after Redis
lost its data simply overwrites its own key, and nothing is counted twice or lost.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from gateway.routing.adaptive import (
    ALL,
    BackendStats,
    Estimates,
    GroupStats,
    Learner,
    Observation,
)

Key = tuple[str, str]


def combine(parts: Iterable[BackendStats], at: int) -> BackendStats:
    """One backend's statistics from independent, already aged ``parts`` (current at group
    count ``at``): weights and counts add, means and M2 combine exactly (module docstring)."""
    items = list(parts)
    weight = sum(s.weight for s in items)
    if weight > 0:
        mean = sum(s.weight * s.mean for s in items) / weight
    else:
        mean = sum(s.mean for s in items) / len(items)
    m2 = sum(s.m2 + s.weight * (s.mean - mean) ** 2 for s in items)
    return BackendStats(
        at,
        weight,
        mean,
        m2,
        sum(s.drafts for s in items),
        sum(s.accepted for s in items),
        sum(s.steps for s in items),
        sum(s.requests for s in items),
        sum(s.tokens for s in items),
        sum(s.seconds for s in items),
    )


def merge_group(groups: Iterable[GroupStats], decay: float) -> GroupStats:
    """The groups of one (task, bucket) from several replicas as one group."""
    items = list(groups)
    count = sum(g.count for g in items)
    names = dict.fromkeys(n for g in items for n in g.backends)
    backends = {}
    for name in names:
        parts = [g.current(name, decay) for g in items]
        backends[name] = combine((p for p in parts if p is not None), count)
    return GroupStats(count, backends)


def merge_states(states: Iterable[Mapping[Key, GroupStats]], decay: float) -> dict[Key, GroupStats]:
    """Several replicas' groups merged per key (a key seen by one replica is kept as is)."""
    by_key: dict[Key, list[GroupStats]] = {}
    for state in states:
        for key, group in state.items():
            by_key.setdefault(key, []).append(group)
    return {
        key: groups[0] if len(groups) == 1 else merge_group(groups, decay)
        for key, groups in by_key.items()
    }


class SharedLearner(Learner):
    """A :class:`Learner` whose :meth:`view` (what routing reads) is its own groups merged
    with its peers' (:meth:`set_peers`, from the sync loop). ``groups`` and
    ``observations`` stay this replica's own: they are what it saves and publishes."""

    def __init__(self, decay: float = 0.95) -> None:
        super().__init__(decay)
        self.peers: dict[Key, GroupStats] = {}
        self.peer_observations = 0
        self._merged: dict[Key, GroupStats] = {}

    def set_peers(self, groups: Mapping[Key, GroupStats], observations: int) -> None:
        """Replace the peers' summed groups (and their observation count) and re-merge."""
        self.peers, self.peer_observations = dict(groups), observations
        self._merged = merge_states([self.groups, self.peers], self.decay)

    def observe(self, obs: Observation) -> None:
        """Learn locally, then re-merge the two groups the observation touched."""
        super().observe(obs)
        self._remerge((obs.task, obs.bucket), (obs.task, ALL))

    def mark_probed(self, task: str, bucket: str, backend: str) -> None:
        """Mark locally, then re-merge the group marked (the mark must show in
        :meth:`view` at once: a probe's answers may teach nothing)."""
        super().mark_probed(task, bucket, backend)
        self._remerge((task, bucket))

    def _remerge(self, *keys: Key) -> None:
        """Re-merge this replica's groups of ``keys`` (each present) with its peers'."""
        if not self.peers:
            return
        for key in keys:
            peer, own = self.peers.get(key), self.groups[key]
            self._merged[key] = own if peer is None else merge_group([own, peer], self.decay)

    def view(self) -> Estimates:
        """The fleet's estimates (only this replica's while it knows of no peer)."""
        return MappingProxyType(self._merged) if self.peers else super().view()
