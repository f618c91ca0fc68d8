"""Load as routing sees it: shared compute, and speed learnt per concurrency.

Backends of one ``compute_group`` (servers on the same GPU, or every CPU server of a machine)
share their compute: two of them decoding at once each get a share of it and, on CPUs, thrash
each other's caches and threads (measured on the local stack, docs/benchmarks.md: a wave of 8
requests spread over two CPU servers on the same 2 cores took 21-27 s, against 5 s on one).
So when a group is busy, sending a request to any backend of it but the busiest spreads the
load: :func:`load_view` marks such candidates, and the policy discounts them by
``routing.shared_compute_penalty``.

The concurrency a request runs at is the group's batch (running + waiting, or this gateway's
in-flight count when higher, or the group's recent peak; the requests arriving with it
added) plus the request; speed is learnt per band of it (see
:func:`gateway.routing.adaptive.bucket_of`).
:func:`measured_at_load` says when both a speculative backend and a plain one have been
measured in a band, so their speeds decide instead of the configured
``max_batch_for_speculation`` (up to twice it for a backend not holding a burst of this
gateway's: :meth:`gateway.routing.policy.RoutingPolicy._pass_over`); :func:`break_even`
reads, per speculative backend and task, the lowest measured band at which it stopped
paying.

Pure code: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.routing.adaptive import ALL, Estimates, bucket_load
from gateway.routing.adaptive_choice import stand_in


def compute_peers(groups: Mapping[str, str | None]) -> dict[str, tuple[str, ...]]:
    """Per backend (``groups``: backend -> its ``compute_group``), the other servers on its
    compute, in ``groups``' order; empty without a group."""
    return {
        n: tuple(m for m, h in groups.items() if g is not None and h == g and m != n)
        for n, g in groups.items()
    }


@dataclass(frozen=True, slots=True)
class LoadView:
    """``concurrency``: per backend, the requests on its compute before a new one joins (the
    group's summed batch, or its own batch without a group, plus its share of the requests
    arriving with the new one; at least the recent peak less one, see :func:`load_view`);
    ``spreads``: idle backends of a busy group (choosing one makes two servers compete for the
    same compute); ``followers``: busy backends of a group that has a leading one (choosing one
    keeps two servers competing); ``peaks``: per backend, the recent peak of its group (its own
    without a group); ``bursts``: leading backends holding this gateway's requests in flight, in
    groups of two or more (a burst of ours runs there, and a request sent elsewhere in the group
    would split it); ``queued``: per backend, the requests on its compute now (the group's
    summed batch, its own without a group; no recent peak), what replicas of one kind are
    balanced on."""

    concurrency: Mapping[str, float]
    spreads: frozenset[str]
    followers: frozenset[str] = frozenset()
    peaks: Mapping[str, float] = field(default_factory=dict)
    bursts: frozenset[str] = frozenset()
    queued: Mapping[str, float] = field(default_factory=dict)


def load_view(
    groups: Mapping[str, str | None],
    batch: Mapping[str, float],
    recent: Mapping[str, float] | None = None,
    inflight: Mapping[str, float] | None = None,
    arriving: Mapping[str, float] | None = None,
) -> LoadView:
    """The :class:`LoadView` for backends' ``compute_group`` names, current ``batch``
    (requests running or waiting per backend), ``recent`` peak in-flight counts, this
    gateway's own ``inflight`` requests and the requests ``arriving`` on each backend's
    compute with the one being routed, not routed yet (:mod:`gateway.arrivals`; added to
    ``concurrency`` only: they are not on a server yet). Backends missing from any count 0.

    A group's load is the higher of its summed batch and its members' highest recent peak
    less one: a burst's first requests meet an idle server, and are routed (and learnt) at
    the load the burst brings. When a group is busy, its idle members spread load and its
    busy members other than the leading one follow: one server batching a wave beats
    several time-slicing the same GPU (docs/benchmarks.md, section 7: a wave split over
    three servers of one H200 ran at 0.5-0.8x plain alone), so the leader keeps the load
    until another is clearly faster. The leader is the member with most of this gateway's
    requests in flight, then the largest batch: a scraped batch can be one interval old
    (other clients' requests that ended since), while the gateway's own count is exact, so
    a stale count elsewhere in the group does not pull a burst of ours apart (simulator,
    docs/benchmarks.md section 7, session 13). Ties lead together.
    """
    recent = recent or {}
    inflight = inflight or {}
    arriving = arriving or {}
    totals: dict[str, float] = {}
    peaks: dict[str, float] = {}
    leads: dict[str, tuple[float, float]] = {}
    members: dict[str, int] = {}
    for name, group in groups.items():
        if group is not None:
            members[group] = members.get(group, 0) + 1
            load = batch.get(name, 0.0)
            totals[group] = totals.get(group, 0.0) + load
            peaks[group] = max(peaks.get(group, 0.0), recent.get(name, 0.0))
            leads[group] = max(leads.get(group, (0.0, 0.0)), (inflight.get(name, 0.0), load))
    concurrency: dict[str, float] = {}
    queued: dict[str, float] = {}
    peak: dict[str, float] = {}
    spreads, followers, bursts = set(), set(), set()
    for name, group in groups.items():
        own = batch.get(name, 0.0)
        if group is None:
            peak[name] = recent.get(name, 0.0)
            queued[name] = own
            concurrency[name] = max(own + arriving.get(name, 0.0), peak[name] - 1)
            continue
        peak[name] = peaks[group]
        queued[name] = totals[group]
        concurrency[name] = max(totals[group] + arriving.get(name, 0.0), peaks[group] - 1)
        mine = inflight.get(name, 0.0)
        if own <= 0 < totals[group]:
            spreads.add(name)
        elif (mine, own) < leads[group]:
            followers.add(name)
        elif mine > 0 and members[group] > 1:
            bursts.add(name)
    return LoadView(
        concurrency, frozenset(spreads), frozenset(followers), peak, frozenset(bursts), queued
    )


def _weight(estimates: Estimates, key: tuple[str, str], name: str, decay: float) -> float:
    group = estimates.get(key)
    stats = group.backends.get(name) if group is not None else None
    if group is None or stats is None:
        return 0.0
    return stats.weight * group.factor(stats, decay)


def measured_at_load(
    estimates: Estimates,
    task: str,
    buckets: Mapping[str, str],
    backend: str,
    plains: Iterable[str],
    *,
    min_weight: float,
    decay: float,
    alike: Sequence[str] = (),
) -> bool:
    """True when ``backend`` (or, never observed for ``task``, the replica among ``alike``
    that stands in for it: :func:`~gateway.routing.adaptive_choice.stand_in`, as the choice
    reads it) and at least one of ``plains`` each have ``min_weight`` decayed observations
    for ``task`` in ``backend``'s / their own bucket (``buckets``: per backend, load band
    included), so their learnt speeds can decide at this load."""
    source = stand_in(estimates, task, backend, alike, decay)
    if _weight(estimates, (task, buckets[backend]), source, decay) < min_weight:
        return False
    return any(
        _weight(estimates, (task, buckets[p]), p, decay) >= min_weight
        for p in plains
        if p in buckets
    )


def observed_at_load(
    estimates: Estimates,
    task: str,
    bucket: str,
    backend: str,
    *,
    decay: float,
    alike: Sequence[str] = (),
) -> bool:
    """True when ``backend`` (or, never observed for ``task``, the replica among ``alike``
    that stands in for it, as in :func:`measured_at_load`) has a record for ``task`` in
    ``bucket`` (load band included; :data:`~gateway.routing.adaptive.ALL`: any load):
    observed there, however little weight that keeps now, or probed there
    (:meth:`~gateway.routing.adaptive.Learner.mark_probed`)."""
    group = estimates.get((task, bucket))
    if group is None:
        return False
    return backend in group.backends or stand_in(estimates, task, backend, alike, decay) in (
        group.backends
    )


def break_even(
    estimates: Estimates,
    speculative: Iterable[str],
    plain: str,
    *,
    min_weight: float,
    decay: float,
) -> dict[str, dict[str, Any]]:
    """Per speculative backend and task: the load bands where it and ``plain`` were both
    measured in the same bucket (``min_weight`` each), its speed relative to plain in each,
    and ``stops_paying_at``: the lowest measured band where it was slower (None while it
    paid in every measured band, or nothing was measured).

    Shape: ``{backend: {task: {"bands": {"1": 1.21, "4": 0.83}, "stops_paying_at": 4}}}``;
    ratios are of speeds (:attr:`~gateway.routing.adaptive.BackendStats.log_speed`),
    geometric-mean averaged over the task's measured buckets.
    """
    out: dict[str, dict[str, Any]] = {}
    for name in speculative:
        ratios: dict[str, dict[int, list[float]]] = {}
        for (task, bucket), group in estimates.items():
            s, p = group.backends.get(name), group.backends.get(plain)
            if bucket == ALL or s is None or p is None:
                continue
            weight = min(s.weight * group.factor(s, decay), p.weight * group.factor(p, decay))
            if weight < min_weight:
                continue
            bands = ratios.setdefault(task, {})
            bands.setdefault(bucket_load(bucket), []).append(math.exp(s.log_speed - p.log_speed))
        tasks: dict[str, Any] = {}
        for task, bands in sorted(ratios.items()):
            mean = {b: math.exp(sum(map(math.log, r)) / len(r)) for b, r in sorted(bands.items())}
            stops = next((b for b, ratio in mean.items() if ratio < 1.0), None)
            tasks[task] = {
                "bands": {str(b): round(ratio, 3) for b, ratio in mean.items()},
                "stops_paying_at": stops,
            }
        out[name] = tasks
    return out
