"""Adaptive choice among the backends a rule allows: Thompson sampling on learnt speed.

For each candidate the learnt ln(tokens/s) statistics (:mod:`gateway.routing.adaptive`) give
a normal posterior of its mean speed for this (task, bucket): the bucket's own
observations, filled up to ``prior_weight`` with pseudo-observations of a prior mean
(hierarchical shrinkage, so a new bucket starts from what the task already knows; a bucket
with that much weight of its own stands alone). The prior is matched in load
(:func:`_prior`): the same temperature and prompt bands at the nearest load bands that
measured the backend, topped up with its task-level mean where they measured too little. A
task-level mean pools loads, and each backend is measured at the loads it was sent: on the
GPU cost twin's eleventh run (docs/benchmarks.md section 7) plain's chat mean was 166
tokens/s (356 requests, mostly at c=16-64) and EAGLE-3's 225 (35, at c=1-4), so at c=4,
where the bucket measured plain at 205 and EAGLE-3 at 180, the two pseudo-observations of
each turned the choice to EAGLE-3 and every wave of 4 ran there (0.76-0.96x plain but on
code); the twenty-fourth run's waves of 32 went the same way with a prior of neighbouring
bands and the task level beside 7-15 requests of each (:func:`_prior`). One value
is drawn per candidate and the largest draw wins (Thompson 1933; Russo et al., "A Tutorial
on Thompson Sampling", 2018): a candidate is chosen with the probability that it is the
fastest, so clear losers are rarely tried and close ones share traffic until the data
separates them. As a loser's evidence decays its posterior widens and it is tried again,
which is how a backend that got better is noticed. Until some candidate has been observed for
the task, the rules' first candidate is chosen (a fresh gateway routes as the static policy
does); after that a backend never observed for the task (nor any replica of its kind) gets
an optimistic prior (the best candidate's mean, wide), so each is tried early, and a
candidate that has answered once in a bucket gets the next lone request there
(:func:`_second_answer`), so one slow answer does not hold it out.

Pure: the estimates and the ``random.Random`` come from the caller; for a given state and
seed the choice is deterministic.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from gateway.routing.adaptive import (
    ALL,
    BANDS,
    BackendStats,
    Estimates,
    GroupStats,
    base_bucket,
    bucket_load,
    with_load,
)

#: Prior standard deviation of one request's ln(speed) (about +-28%), blended with the
#: spread observed over the task's backends as 2 pseudo-observations.
OBS_SD = 0.25
OBS_SD_WEIGHT = 2.0
#: Pseudo-weight of the optimistic prior of a never-observed backend (posterior sd 0.35).
UNSEEN_WEIGHT = 0.5
#: Cap on a posterior sd in ln units, so a long-unused backend is not drawn absurdly fast.
MAX_SD = 1.0


class Estimate(NamedTuple):
    """What adaptive routing believes about one candidate for this request (a NamedTuple:
    immutable and cheap to build on the hot path).

    ``source``: ``bucket`` (observed in this bucket), ``task`` (only in its prior: the
    other load bands or the task level), ``replica`` (never observed for the task: a
    replica of its kind was, and its statistics stand in, :func:`stand_in`) or ``prior``
    (neither it nor a replica observed for the task); ``requests``: its own observations in
    the bucket ever;
    ``weight``: their decayed weight; ``speed_tps``: posterior mean speed (tokens/s: the
    exponential of the posterior mean of ln(tokens over seconds)); ``sd``: posterior sd of
    ln(speed); ``relative``: speed / the plain baseline's (None without one);
    ``acceptance_rate`` and ``mean_acceptance_length``: the bucket's decayed per-request
    acceptance (speculative backends); ``draw``: the Thompson
    sample in tokens/s (None when there was nothing to choose); ``penalty``: the factor on
    its expected speed for spreading load over shared compute (1.0: none); ``bucket``: the
    feature bucket it was judged in (its load band included).
    """

    backend: str
    source: str
    requests: int
    weight: float
    speed_tps: float
    sd: float
    relative: float | None
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    draw: float | None
    penalty: float = 1.0
    bucket: str = ""

    def to_json(self) -> dict[str, Any]:
        """JSON-ready fields, rounded for display."""
        return {
            "backend": self.backend,
            "source": self.source,
            "requests": self.requests,
            "weight": round(self.weight, 3),
            "speed_tps": round(self.speed_tps, 2),
            "sd_log": round(self.sd, 3),
            "relative_to_plain": _round(self.relative),
            "acceptance_rate": _round(self.acceptance_rate),
            "mean_acceptance_length": _round(self.mean_acceptance_length),
            "draw_tps": None if self.draw is None else round(self.draw, 2),
            "shared_compute_penalty": round(self.penalty, 3),
            "bucket": self.bucket,
        }


@dataclass(slots=True)
class AdaptiveChoice:
    """The adaptive pick for one request: ``chosen`` (the largest draw), ``best`` (the
    highest posterior mean), ``explored`` (they differ: this request pays for exploration),
    ``untried`` (nothing was measured for the task: the rules' choice), and
    :attr:`estimates`, the estimate behind each candidate (built on first read: a routed
    request never reads it, ``/routes/explain`` does; this request's own, also for a
    choice made for a ``cohort``)."""

    task: str
    bucket: str
    chosen: str
    best: str
    explored: bool
    untried: bool
    _rows: Callable[[], tuple[Estimate, ...]]
    _estimates: tuple[Estimate, ...] | None = None
    #: Requests of a cohort the choice was made for, by task (:func:`choose`'s ``cohort``;
    #: empty: for this request alone).
    cohort: Mapping[str, int] = field(default_factory=dict)
    #: ``chosen`` had one answer of its own in its bucket and takes this lone request for its
    #: second (:func:`_second_answer`), whatever the draws said.
    second: bool = False

    @property
    def estimates(self) -> tuple[Estimate, ...]:
        """One :class:`Estimate` per candidate, in candidate order."""
        if self._estimates is None:
            self._estimates = self._rows()
        return self._estimates

    def to_json(self) -> dict[str, Any]:
        """The ``adaptive`` object of ``/routes/explain``."""
        out: dict[str, Any] = {
            "task": self.task,
            "bucket": self.bucket,
            "chosen": self.chosen,
            "best": self.best,
            "explored": self.explored,
            "estimates": [e.to_json() for e in self.estimates],
        }
        if self.cohort:
            out["cohort"] = dict(self.cohort)
        if self.second:
            out["second_answer"] = True
        return out


class _Seen(NamedTuple):
    """A backend's statistics in a group and the weight they keep now (lazy decay)."""

    stats: BackendStats
    factor: float


class _Prior(NamedTuple):
    """A backend's prior for a bucket: ``mean`` ln(tokens/s) and the decayed ``weight`` behind
    it (at most what the bucket needs to reach ``prior_weight``)."""

    mean: float
    weight: float


class _Posterior(NamedTuple):
    source: str
    mean: float
    sd: float
    weight: float


def _seen(group: GroupStats | None, name: str, decay: float) -> _Seen | None:
    stats = group.backends.get(name) if group is not None else None
    if group is None or stats is None or not stats.requests:
        return None
    return _Seen(stats, group.factor(stats, decay))


def stand_in(
    estimates: Estimates, task: str, backend: str, alike: Sequence[str], decay: float
) -> str:
    """Whose statistics speak for ``backend`` for ``task``: its own once it was observed for
    the task; before that, those of the one of ``alike`` (its replicas: one served model,
    the same speculation settings) observed most for it (decayed weight at the task level);
    ``backend`` itself when none was. A replica's own record, even a short one, is never
    replaced by another's: a slow GPU shows as soon as it answered once."""
    group = estimates.get((task, ALL))
    if not alike or group is None or _seen(group, backend, decay) is not None:
        return backend
    best, most = backend, 0.0
    for name in alike:
        found = _seen(group, name, decay)
        if found is not None and found.stats.weight * found.factor > most:
            best, most = name, found.stats.weight * found.factor
    return best


def _neighbours(estimates: Estimates, task: str, bucket: str) -> Iterator[tuple[GroupStats, ...]]:
    """The groups of ``bucket``'s temperature and prompt bands at the other load bands
    (:data:`gateway.routing.adaptive.BANDS`), nearest first, generated as read: one ring per
    distance in bands (one below and one above, those that exist), empty rings left out."""
    base, band = base_bucket(bucket), bucket_load(bucket)
    if band not in BANDS:
        return
    at = BANDS.index(band)
    for d in range(1, len(BANDS)):
        ring = tuple(
            group
            for i in (at - d, at + d)
            if 0 <= i < len(BANDS)
            and (group := estimates.get((task, with_load(base, BANDS[i])))) is not None
        )
        if ring:
            yield ring


def _prior(
    name: str,
    near: Iterable[tuple[GroupStats, ...]],
    task: GroupStats | None,
    decay: float,
    needed: float,
) -> _Prior | None:
    """``name``'s prior for a bucket, of ``needed`` pseudo-observations at most: what the
    other load bands (``near``, nearest first: :func:`_neighbours`) measured of it, the
    nearest first, topped up with its task-level mean (``task``); None when it was never
    observed for the task.

    ``needed`` is ``prior_weight`` less the bucket's own decayed weight (:func:`_beliefs`):
    the prior only fills in for a bucket that has measured too little, since every other
    load is a biased stand-in for this one. Pooled over loads, a prior told EAGLE-3 from
    plain by where each was sent rather than by their speed here: on the GPU cost twin's
    twenty-fourth run (docs/benchmarks.md section 7) EAGLE-3's waves of 32 measured 82-101
    tokens/s a request on chat and creative against plain's 106-114, and two
    pseudo-observations of EAGLE-3's task-level mean (mostly c=1-16: chat 195, creative 145)
    against plain's c=48 band (104-106) made a wave of 32 EAGLE-3's: every one of the last
    three repeats went there (0.88-0.97x plain). Where a bucket has too little of its
    own, the nearest bands stand in before the task level: at rag c=1 that run had one
    EAGLE-3 answer (125 tokens/s) topped up with EAGLE-3's task-level 118 (mostly c=4-32),
    where its c=4 band had measured 195-208.

    The refill comes from the other bands only, so as a bucket's own weight decays below
    ``prior_weight`` (its group's other requests age it), the estimate slides towards the
    nearest band's: under sustained waves a backend slower here but fast a band below is
    sent a wave again now and then (one wave of 32 in six where it runs 0.86x plain here and
    1.45x a band below, at decay 0.98, against one in 14 with the old prior:
    ``tests/unit/test_adaptive.py::test_a_slower_backend_standing_alone_in_a_band_is_retried_now_and_then``),
    which is also how a backend that got faster here is noticed.

    The weight taken from the other bands is capped by the backend's decayed task-level
    weight: the task group ages with every request of the task, a quiet band only with its
    own, so without the cap a stale band would keep a backend's prior sure forever and it
    would never be tried again (as :mod:`gateway.routing.adaptive` promises a stale estimate
    is)."""
    seen = _seen(task, name, decay)
    if seen is None:
        return None
    w_task, m_task = seen.stats.weight * seen.factor, seen.stats.log_speed
    cap = min(w_task, needed)
    weight = total = 0.0
    for ring in near if cap > 0 else ():
        w_ring = m_ring = 0.0
        for group in ring:
            here = _seen(group, name, decay)
            if here is not None:
                w = here.stats.weight * here.factor
                w_ring, m_ring = w_ring + w, m_ring + w * here.stats.log_speed
        if w_ring > 0:
            take = min(w_ring, cap - weight)
            weight, total = weight + take, total + take * m_ring / w_ring
            if weight >= cap:
                break
    if weight < cap:  # the task level tops it up
        total, weight = total + (cap - weight) * m_task, cap
    if weight <= 0:
        return _Prior(m_task, 0.0)
    return _Prior(total / weight, weight)


def _noise(group: GroupStats | None, decay: float) -> float:
    """Variance of one request's ln(speed), pooled over every backend of the task (the
    machine's load moves them all), with the prior as ``OBS_SD_WEIGHT`` observations."""
    m2, weight = OBS_SD_WEIGHT * OBS_SD**2, OBS_SD_WEIGHT
    for stats in group.backends.values() if group is not None else ():
        f = group.factor(stats, decay) if group is not None else 1.0
        m2, weight = m2 + stats.m2 * f, weight + stats.weight * f
    return m2 / weight


def _posterior(
    bucket: _Seen | None, task: _Prior | None, optimistic: float, var: float
) -> _Posterior:
    """Normal posterior of the mean ln(speed) from bucket data and the prior (:func:`_prior`,
    which fills the bucket's weight up to ``prior_weight``); ``var``: the per-request
    variance."""
    if bucket is None and task is None:
        return _Posterior("prior", optimistic, math.sqrt(var / UNSEEN_WEIGHT), 0.0)
    w_b = bucket.stats.weight * bucket.factor if bucket is not None else 0.0
    w_t = task.weight if task is not None else 0.0
    m_b = bucket.stats.log_speed if bucket is not None else 0.0
    m_t = task.mean if task is not None else 0.0
    n = w_b + w_t
    mean = (w_b * m_b + w_t * m_t) / n if n > 0 else (m_b if bucket is not None else m_t)
    sd = min(math.sqrt(var / max(n, 1e-9)), MAX_SD)
    return _Posterior("bucket" if bucket is not None else "task", mean, sd, w_b)


def _source(
    estimates: Estimates,
    task: str,
    name: str,
    replicas: Mapping[str, Sequence[str]] | None,
    decay: float,
) -> str:
    """Whose statistics speak for backend ``name`` (:func:`stand_in`; ``name`` itself
    without ``replicas``)."""
    return stand_in(estimates, task, name, replicas.get(name, ()), decay) if replicas else name


def _beliefs(
    task: str,
    buckets: Mapping[str, str],
    names: Sequence[str],
    estimates: Estimates,
    decay: float,
    prior_weight: float,
    penalties: Mapping[str, float] | None,
    replicas: Mapping[str, Sequence[str]] | None,
) -> tuple[dict[str, _Posterior], dict[str, float]]:
    """Each of ``names``' posterior for ``task`` in its bucket (``buckets``; a name without
    one: the first name's) and its penalty as a shift of its mean ln(speed) (see
    :func:`choose` for the arguments)."""
    first = buckets[names[0]]
    prior = estimates.get((task, ALL))
    groups = {n: estimates.get((task, buckets.get(n, first))) for n in names}
    seen: dict[str, tuple[_Seen | None, _Prior | None]] = {}
    borrowed: set[str] = set()
    for n in names:
        src = _source(estimates, task, n, replicas, decay)
        if src != n:
            borrowed.add(n)
        own = _seen(groups[n], src, decay)
        needed = prior_weight - (own.stats.weight * own.factor if own is not None else 0.0)
        around = _neighbours(estimates, task, buckets.get(n, first))  # read only as needed
        seen[n] = (own, _prior(src, around, prior, decay, max(needed, 0.0)))
    known = [
        b.stats.log_speed if b is not None else t.mean if t is not None else None
        for b, t in seen.values()
    ]
    optimistic = max((k for k in known if k is not None), default=0.0)
    var = _noise(prior, decay)
    post = {n: _posterior(b, t, optimistic, var) for n, (b, t) in seen.items()}
    for n in borrowed:
        post[n] = post[n]._replace(source="replica")
    shift = dict.fromkeys(names, 0.0)
    for n, factor in (penalties or {}).items():
        if n in shift:
            shift[n] = math.log(min(max(factor, 1e-6), 1.0))
    return post, shift


def choose(
    task: str,
    bucket: str | Mapping[str, str],
    candidates: Sequence[str],
    estimates: Estimates,
    rng: random.Random,
    *,
    decay: float,
    prior_weight: float = 2.0,
    baseline: str | None = None,
    penalties: Mapping[str, float] | None = None,
    explore: float = 1.0,
    replicas: Mapping[str, Sequence[str]] | None = None,
    cohort: Sequence[tuple[str, Mapping[str, str]]] = (),
) -> AdaptiveChoice:
    """Pick one of ``candidates`` (non-empty, in try-list order: the rules' order) by
    Thompson sampling.

    ``bucket``: the feature bucket, one for all or per candidate (load bands differ between
    backends on different compute). ``baseline`` names the plain backend speeds are shown
    relative to. ``penalties``: a factor in (0, 1] on a candidate's expected speed (the cost
    of spreading load over backends that share compute, see :mod:`gateway.routing.policy`).
    While no candidate has been observed for the task the rules' first candidate is taken
    (a fresh gateway routes like the static policy: the caller keeps a busy compute's load
    together as that policy does); then one ``rng.normalvariate`` draw per candidate, in
    order, when there are two or more; at ``explore`` 1 a candidate with one answer of its
    own in its bucket takes the request instead (:func:`_second_answer`). ``explore`` in
    [0, 1] scales each
    draw's spread: 0 takes the best posterior mean (no draw), as for a request joining a busy
    shared compute (one request sent elsewhere slows the whole batch and measures nothing
    its load band can use); below 1 where a choice commits a whole burst to one backend.
    ``replicas``: per candidate, the other backends of its kind (one served model, the same
    speculation settings); a candidate never observed for the task is judged on the
    statistics of the replica observed most for it (:func:`stand_in`; source ``replica``),
    so a fleet learns a kind's speed once instead of once per server: without it each of 8
    replicas of a kind started from the optimistic prior of a never-observed backend and was
    tried for each task (simulator, 8 GPUs x plain and EAGLE-3 at c=16: 9 of 19 creative
    requests on EAGLE-3 were sent there by such a prior; docs/benchmarks.md section 7b).
    ``cohort``: the other requests of a cohort waiting for this one's choice, each as its
    task and bucket per candidate (:func:`_for_cohort`; read on an idle compute only, no
    ``penalties``; empty: this request alone).
    """
    if cohort and len(candidates) > 1 and not penalties:
        own = (task, _per_candidate(bucket, candidates))
        return _for_cohort(
            [own, *cohort],
            candidates,
            estimates,
            rng,
            decay=decay,
            prior_weight=prior_weight,
            baseline=baseline,
            explore=explore,
            replicas=replicas,
        )
    buckets = _per_candidate(bucket, candidates)
    first = buckets[candidates[0]]
    names = list(dict.fromkeys([*candidates, *([baseline] if baseline else [])]))
    groups = {n: estimates.get((task, buckets.get(n, first))) for n in names}

    def beliefs() -> tuple[dict[str, _Posterior], dict[str, float]]:
        return _beliefs(task, buckets, names, estimates, decay, prior_weight, penalties, replicas)

    def rows(
        post: dict[str, _Posterior], shift: dict[str, float], draws: dict[str, float]
    ) -> tuple[Estimate, ...]:
        base = post[baseline] if baseline is not None else None
        base_mean = base.mean if base is not None and base.source != "prior" else None
        out = []
        for n in candidates:
            p, here = post[n], _seen(groups[n], n, decay)
            stats = here.stats if here is not None else None
            relative = None
            if base_mean is not None and p.source != "prior":
                relative = math.exp(p.mean - base_mean)
            out.append(
                Estimate(
                    n,
                    p.source,
                    stats.requests if stats else 0,
                    p.weight,
                    math.exp(p.mean) if p.source != "prior" else 0.0,
                    p.sd,
                    relative,
                    stats.acceptance_rate if stats else None,
                    stats.mean_acceptance_length if stats else None,
                    math.exp(draws[n]) if n in draws else None,
                    math.exp(shift[n]),
                    buckets[n],
                )
            )
        return tuple(out)

    if len(candidates) == 1:  # nothing to choose from (most requests under load): no posterior
        only = candidates[0]
        src = _source(estimates, task, only, replicas, decay)
        task_level = estimates.get((task, ALL))
        untried = (_seen(groups[only], src, decay) or _seen(task_level, src, decay)) is None
        return AdaptiveChoice(task, first, only, only, False, untried, lambda: rows(*beliefs(), {}))
    post, shift = beliefs()
    draws: dict[str, float] = {}
    untried = all(post[n].source == "prior" for n in candidates)
    if not untried and explore > 0:
        draws = {
            n: rng.normalvariate(post[n].mean, post[n].sd * explore) + shift[n] for n in candidates
        }
    second = None
    if untried:
        best = chosen = candidates[0]
    else:
        best = max(candidates, key=lambda n: post[n].mean + shift[n])
        chosen = max(candidates, key=lambda n: draws[n]) if draws else best
        if explore >= 1:
            second = _second_answer(candidates, groups, best, draws, decay)
            chosen = second or chosen
    explored = chosen != best
    return AdaptiveChoice(
        task,
        buckets[chosen],
        chosen,
        best,
        explored,
        untried,
        lambda: rows(post, shift, draws),
        second=second is not None,
    )


#: Answers of its own a candidate needs in a bucket before they alone may hold it out of a
#: lone request there (:func:`_second_answer`).
MIN_ANSWERS = 2


def _second_answer(
    candidates: Sequence[str],
    groups: Mapping[str, GroupStats | None],
    best: str,
    draws: Mapping[str, float],
    decay: float,
) -> str | None:
    """The candidate a lone request goes to for its second answer in its bucket: of those
    other than ``best`` with fewer than :data:`MIN_ANSWERS` but at least one answer of their
    own in their bucket (``groups``: each candidate's group for this task and bucket), the
    one of largest draw (``draws``: one per candidate); None when there is none.

    One answer is a poor estimate of a backend's speed: on the GPU cost twin's
    twenty-fifth run (docs/benchmarks.md section 7) the warm-up gave EAGLE-3 one rag
    answer at c=1, 9 tokens at 73 tokens/s (first token at 76 ms), where it ran the cell at
    188 tokens/s against plain's 162, and 23 of the 24 rag requests at c=1 that followed
    went to plain (0.84x the oracle). From that warm-up's answers alone
    (``tests/unit/test_adaptive.py::test_one_slow_answer_does_not_hold_a_backend_out_of_a_lone_request``)
    EAGLE-3's posterior reads 73 tokens/s, sd 0.16 in ln units, against plain's 140, sd
    0.10 (the Thompson spread is the task's, pooled over its backends): 3.4 sd apart, and
    2 draws in 5,000 choose it. So a candidate that answered once is sent the next lone
    request before one answer may hold it out: at most one request per candidate and
    bucket in a gateway's life (``requests`` never decays), and only for a lone request
    (``explore`` 1: :func:`choose`), so no burst is committed to it. A candidate with no
    answer of its own in the bucket keeps its prior and the draw. (UCB1 likewise plays
    every arm once before its index decides: Auer et al., "Finite-time Analysis of the
    Multiarmed Bandit Problem", 2002; here a second answer, as one answer's speed is the
    noisiest.)"""
    short = [
        n
        for n in candidates
        if n != best
        and (seen := _seen(groups.get(n), n, decay)) is not None
        and seen.stats.requests < MIN_ANSWERS
    ]
    return max(short, key=draws.__getitem__) if short else None


#: The most distinct (task, bucket) kinds of a cohort's requests :func:`choose` (its
#: ``cohort``) reads, the first request's included (in order of entry): each costs one
#: posterior per candidate, and the cohort waits for its first request's choice.
COHORT_KINDS = 9


def _per_candidate(bucket: str | Mapping[str, str], candidates: Sequence[str]) -> dict[str, str]:
    """``bucket`` per candidate: one for all (a string) or already per candidate."""
    return {n: bucket if isinstance(bucket, str) else bucket[n] for n in candidates}


def _for_cohort(
    cohort: Sequence[tuple[str, Mapping[str, str]]],
    candidates: Sequence[str],
    estimates: Estimates,
    rng: random.Random,
    *,
    decay: float,
    prior_weight: float = 2.0,
    baseline: str | None = None,
    explore: float = 1.0,
    replicas: Mapping[str, Sequence[str]] | None = None,
) -> AdaptiveChoice:
    """:func:`choose` for a cohort, requests arriving together that will run on one
    backend (:mod:`gateway.arrivals`; a wave follows its first request): the one
    with the largest summed speed over the cohort, each request in its own task and bucket.

    ``cohort``: per request, its task and its bucket per candidate, the first request's
    first (the others in order of entry); other arguments as :func:`choose` (no penalties:
    an idle compute). Requests alike in task and buckets share one posterior (of that
    bucket's mean speed), so one value is drawn per kind and per candidate
    (``rng.normalvariate``, spread scaled by ``explore``; 0: the posterior means) and
    counted once per request of the kind; at most :data:`COHORT_KINDS` kinds are read,
    the first request's included. A kind with nothing measured for its task on any
    candidate does not count. Chosen by the first request's task alone, the simulator's
    waves of code, rag, chat and creative at c=4 went to plain mostly when a creative
    request came first (3-5 of 24 waves a run), where EAGLE-3 ran
    such waves at 237-242 tokens/s against plain's 206 (H200 profile; docs/benchmarks.md
    section 7b, session 28).

    Returns the cohort's choice (its ``estimates``, built when read, are the first
    request's own; ``bucket``: the first request's at the chosen backend; ``cohort``: the
    requests counted, by task); the first request's own :func:`choose` result when the
    requests are all alike (the sum ranks as one request's speed does; ``cohort`` set) or
    none was measured (``cohort`` empty).
    """
    task, buckets = cohort[0]

    def alone(spread: float, draw: random.Random) -> AdaptiveChoice:
        """The first request's own choice."""
        return choose(
            task,
            buckets,
            candidates,
            estimates,
            draw,
            decay=decay,
            prior_weight=prior_weight,
            baseline=baseline,
            explore=spread,
            replicas=replicas,
        )

    kinds: dict[tuple[str, tuple[str, ...]], int] = {}
    for t, b in cohort:
        key = (t, tuple(b[n] for n in candidates))
        if key in kinds or len(kinds) < COHORT_KINDS:
            kinds[key] = kinds.get(key, 0) + 1
    if len(kinds) == 1:  # all alike: the sum ranks as the first request's own speed does
        return replace(alone(explore, rng), cohort={task: len(cohort)})
    names = list(candidates)
    mean = dict.fromkeys(names, 0.0)
    drawn = dict.fromkeys(names, 0.0)
    counted: dict[str, int] = {}
    for (t, key_buckets), count in kinds.items():
        per_candidate = dict(zip(names, key_buckets, strict=True))
        post, _ = _beliefs(t, per_candidate, names, estimates, decay, prior_weight, None, replicas)
        if all(post[n].source == "prior" for n in names):
            continue  # nothing measured for this task: it cannot tell the candidates apart
        counted[t] = counted.get(t, 0) + count
        for n in names:
            p = post[n]
            mean[n] += count * math.exp(p.mean)
            if explore > 0:
                drawn[n] += count * math.exp(rng.normalvariate(p.mean, p.sd * explore))
    if not counted:  # the rules' choice, as the first request's own (untried) would be
        return alone(explore, rng)
    best = max(names, key=mean.__getitem__)
    chosen = max(names, key=drawn.__getitem__) if explore > 0 else best

    def rows() -> tuple[Estimate, ...]:
        return alone(0.0, random.Random(0)).estimates

    return AdaptiveChoice(
        task, buckets[chosen], chosen, best, chosen != best, False, rows, cohort=counted
    )


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)
