"""Running estimates of speed and draft acceptance per (task, bucket, backend).

Each finished request teaches one :class:`Observation`: the backend that served it, its speed
(output tokens per second of the whole request, time to first token included) and, for a
speculative backend, the acceptance vLLM reported for that request
(``metrics.speculative_decoding`` with ``--per-request-spec-decode-metrics``). Observations
are grouped by task and feature bucket (temperature band, prompt self-overlap band, load band)
and by task alone; a bucket that measured little of a backend is filled up from the nearest
load bands that measured it, then the task's group (:func:`gateway.routing.adaptive_choice.choose`).

Estimates follow change by exponential forgetting: every observation in a group multiplies
the weight of everything the group learnt before by ``decay`` (an effective window of about
``1 / (1 - decay)`` requests), including backends that were not chosen, so the confidence in
a stale estimate fades and Thompson sampling (:mod:`gateway.routing.adaptive_choice`) tries
that backend again. A backend's speed is its decayed output tokens over its decayed request
seconds (:attr:`BackendStats.log_speed`: a cell's speed as the benchmark measures it);
the spread of one request's speed is kept as logarithms (speedups multiply; noise is roughly
log-normal): a weighted mean and weighted sum of squared deviations (West 1979).

Pure code with copy-on-write state: :meth:`Learner.view` is a read-only mapping whose values
are never mutated, so a routing decision reads one consistent state.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

#: The bucket name of a task's all-bucket group, the prior of its buckets.
ALL = "*"
#: At or below this temperature a request counts as greedy.
GREEDY_MAX_T = 0.1


#: Lower bounds of the concurrency bands: powers of two up to 16, then half as wide (a
#: factor of 1.5, then 4/3): c1, c2 (2-3), c4 (4-7), c8 (8-15), c16 (16-23), c24 (24-31),
#: c32 (32-47), c48 (48-63), c64 (64-95), c96 (96-127), c128 (128 and more). A GPU
#: server's batch runs to hundreds, and "16 and more" lumped loads that answer at different
#: speeds (plain alone on 8 simulated H200s: first token after 62 ms at 16 requests a GPU,
#: 100 ms at 32; docs/benchmarks.md, section 7, "Session 11"). From 16 on a band twice as
#: wide mixed loads that route differently: on the GPU cost twin plain ran a request at
#: 123 tokens/s in waves of 32 and at 96 in waves of 48, so with EAGLE-3's figures of that
#: band from waves of 32 and plain's from both, the band compared them at different loads
#: (section 7, "Twenty-second run" and "Twenty-third run").
BANDS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)


def load_band(concurrency: float) -> int:
    """The band (the largest of :data:`BANDS` not above it) of ``concurrency`` requests
    sharing the compute a request runs on, itself included (values under 1 count as 1)."""
    c = max(int(concurrency), 1)
    return BANDS[bisect_right(BANDS, c) - 1]


def bucket_of(
    temperature: float, overlap: float | None, overlap_threshold: float, concurrency: float = 1
) -> str:
    """The feature bucket of a request, e.g. ``"greedy/rep"`` or ``"sampled/norep/c8"``.

    Temperature band: ``greedy`` (<= 0.1) or ``sampled``; prompt band: ``rep`` when the share
    of repeated word bigrams is at least ``overlap_threshold``, ``norep`` otherwise or unknown;
    load band (only from 2 on): ``/c2``, ``/c4`` ... ``/c128`` (:data:`BANDS`) for the requests
    sharing the backend's compute at dispatch, this one included (see :func:`load_band`), so
    speed is learnt per concurrency and the concurrency at which speculation stops
    paying is measured, not assumed.
    """
    band = "greedy" if temperature <= GREEDY_MAX_T else "sampled"
    rep = "rep" if overlap is not None and overlap >= overlap_threshold else "norep"
    return with_load(f"{band}/{rep}", load_band(concurrency))


def with_load(base: str, band: int) -> str:
    """The bucket of ``base`` (a bucket without its load band) at load ``band`` (one of
    :data:`BANDS`): ``base`` itself at 1, else ``"{base}/c{band}"``; the inverse of
    :func:`base_bucket` and :func:`bucket_load`."""
    return base if band == 1 else f"{base}/c{band}"


def base_bucket(bucket: str) -> str:
    """``bucket`` without its load band (``"greedy/rep/c4"`` -> ``"greedy/rep"``)."""
    return bucket if bucket.count("/") < 2 else bucket.rsplit("/", 1)[0]


def bucket_load(bucket: str) -> int:
    """The load band of ``bucket`` (1 when it has none)."""
    return int(bucket.rsplit("/c", 1)[1]) if bucket.count("/") >= 2 else 1


class Observation(NamedTuple):
    """One finished request as the learner sees it (a NamedTuple: immutable, and built
    per request at a third of a frozen dataclass's cost, as :class:`BackendStats`).

    ``speed_tps``: output tokens per second of the whole request (time to first token
    included, :meth:`gateway.learning.observer.FeedbackCollector.observe`); ``tokens``:
    output tokens;
    ``draft_tokens``/``accepted_tokens``/``spec_steps``: the request's proposed and accepted
    draft tokens and verify steps (None for a plain backend or when vLLM did not report).
    """

    task: str
    bucket: str
    backend: str
    speed_tps: float
    tokens: int
    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    spec_steps: int | None = None


class BackendStats(NamedTuple):
    """Decayed statistics of one backend in one group (a NamedTuple: two are built per
    observation).

    ``at``: the group's observation count when these were last brought up to date (decay is
    applied lazily: ``decay ** (count - at)``); ``weight``: decayed number of observations;
    ``mean``/``m2``: weighted mean and sum of squared deviations of ln(tokens/s) (the spread
    of one request's speed); ``drafts``/``accepted``/``steps``: decayed draft tokens,
    accepted draft tokens and verify steps; ``requests``: observations ever (not decayed);
    ``tokens``/``seconds``: decayed output tokens and request seconds, whose ratio is the
    speed routing compares (:attr:`log_speed`).
    """

    at: int = 0
    weight: float = 0.0
    mean: float = 0.0
    m2: float = 0.0
    drafts: float = 0.0
    accepted: float = 0.0
    steps: float = 0.0
    requests: int = 0
    tokens: float = 0.0
    seconds: float = 0.0

    def aged(self, count: int, decay: float) -> BackendStats:
        """These statistics as of group observation ``count`` (forgetting applied)."""
        f = 1.0 if count == self.at else decay ** (count - self.at)
        return BackendStats(
            count,
            self.weight * f,
            self.mean,
            self.m2 * f,
            self.drafts * f,
            self.accepted * f,
            self.steps * f,
            self.requests,
            self.tokens * f,
            self.seconds * f,
        )

    def added(self, count: int, decay: float, obs: Observation) -> BackendStats:
        """These statistics aged to group observation ``count``, plus ``obs`` (weight 1)."""
        f = 1.0 if count == self.at else decay ** (count - self.at)
        x = math.log(max(obs.speed_tps, 1e-6))
        weight = self.weight * f + 1.0
        delta = x - self.mean
        mean = self.mean + delta / weight
        drafts, accepted, steps = self.drafts * f, self.accepted * f, self.steps * f
        if obs.draft_tokens is not None and obs.accepted_tokens is not None:
            drafts += obs.draft_tokens
            accepted += obs.accepted_tokens
            steps += obs.spec_steps or 0
        m2 = self.m2 * f + delta * (x - mean)
        tokens, seconds = self.tokens * f, self.seconds * f
        if seconds <= 0 < self.weight:  # a state saved without the sums: its mean stands in
            tokens = self.weight * f * obs.tokens  # for as many answers as long as this one
            seconds = tokens / math.exp(self.mean)
        tokens += obs.tokens
        seconds += obs.tokens / max(obs.speed_tps, 1e-6)
        return BackendStats(
            count, weight, mean, m2, drafts, accepted, steps, self.requests + 1, tokens, seconds
        )

    @property
    def log_speed(self) -> float:
        """ln of the speed routing compares, in tokens/s: decayed output tokens over decayed
        request seconds, the requests' speed as bench.speedup and issue #25's oracle measure
        a cell (``sum(tokens) / sum(seconds)``); ``mean`` (the geometric mean of the
        requests' speeds) for statistics without those sums (a state saved before them).

        Not the geometric mean: a short answer is mostly its first token, so its speed is
        low (a 5-token RAG answer ran at 80-100 tokens/s on the GPU cost twin, 64-token ones
        at 190-290), and a prompt that drafts well is fast (ngram: 560 tokens/s on one RAG
        answer): each request counted alike, the mean follows which requests a backend drew.
        On the twin's answers (three runs' backends alone, ``bench.speed_estimators``,
        docs/benchmarks.md section 7b, session 42) the geometric mean ranked the fastest
        backend first in 62 of 72 cells with every answer, the ratio in 70; on RAG at c=1-16
        (9 and 12 of 12), from 3 or 6 answers a backend, the ratio picked the fastest in 56
        and 64% of draws, the geometric mean in 50 and 54%."""
        if self.seconds > 0:
            return math.log(max(self.tokens, 1e-9) / self.seconds)
        return self.mean

    @property
    def speed_tps(self) -> float:
        """The speed routing compares, tokens/s (:attr:`log_speed`; 0 without data)."""
        return math.exp(self.log_speed) if self.weight > 0 else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        """Decayed accepted / drafted tokens (vLLM's draft acceptance rate), or None."""
        return self.accepted / self.drafts if self.drafts > 0 else None

    @property
    def mean_acceptance_length(self) -> float | None:
        """1 + accepted tokens per verify step (vLLM's definition, bonus token included)."""
        return 1.0 + self.accepted / self.steps if self.steps > 0 else None


@dataclass(frozen=True, slots=True)
class GroupStats:
    """One (task, bucket) group: its observation count and each backend's statistics."""

    count: int = 0
    backends: Mapping[str, BackendStats] = field(default_factory=dict)

    def current(self, backend: str, decay: float) -> BackendStats | None:
        """``backend``'s statistics aged to now, or None if it was never observed here."""
        stats = self.backends.get(backend)
        return None if stats is None else stats.aged(self.count, decay)

    def factor(self, stats: BackendStats, decay: float) -> float:
        """The weight ``stats`` keep now (``decay ** observations since``), without a copy."""
        return 1.0 if stats.at == self.count else decay ** (self.count - stats.at)


#: A group and a backend's statistics before their first observation (immutable: shared,
#: so an observation builds no empty defaults).
_NEW_GROUP, _NEW_STATS = GroupStats(), BackendStats()

#: The read-only state a routing decision reads: (task, bucket) -> group.
Estimates = Mapping[tuple[str, str], GroupStats]


class Learner:
    """The estimator state (lives on the Gateway, so it survives config reloads).

    ``decay`` in (0, 1]: weight kept by past observations of a group at each new one.
    """

    def __init__(self, decay: float = 0.95) -> None:
        self.decay = decay
        self.groups: dict[tuple[str, str], GroupStats] = {}
        self.observations = 0
        #: probes marked (:meth:`mark_probed`): with ``observations``, what changed since
        #: a save or a publication (:attr:`changes`)
        self.marks = 0

    def observe(self, obs: Observation) -> None:
        """Learn from one request: in its (task, bucket) group and its task's prior group."""
        for key in ((obs.task, obs.bucket), (obs.task, ALL)):
            group = self.groups.get(key) or _NEW_GROUP
            count = group.count + 1
            old = group.backends.get(obs.backend) or _NEW_STATS
            new = old.added(count, self.decay, obs)
            self.groups[key] = GroupStats(count, {**group.backends, obs.backend: new})
        self.observations += 1

    def mark_probed(self, task: str, bucket: str, backend: str) -> None:
        """Record that a decision sent ``backend`` a probe for ``task`` in ``bucket``
        (:meth:`gateway.routing.policy.RoutingPolicy._probes`): an empty record (no
        request, no weight) where it has none, which routing's estimates skip
        (``requests`` 0) and :func:`gateway.routing.load.observed_at_load` counts, so the
        bucket is not probed again even when the probe's answers teach nothing."""
        group = self.groups.get((task, bucket)) or _NEW_GROUP
        if backend not in group.backends:
            stats = BackendStats(group.count)
            self.groups[task, bucket] = GroupStats(group.count, {**group.backends, backend: stats})
            self.marks += 1

    @property
    def changes(self) -> int:
        """Observations and probe marks so far: the state changed when this did."""
        return self.observations + self.marks

    def view(self) -> Estimates:
        """A read-only view for routing (its values are immutable; observe replaces them)."""
        return MappingProxyType(self.groups)

    def summary(self) -> list[dict[str, Any]]:
        """Every group's current estimates as routing reads them (:meth:`view`), for
        ``GET /routes``."""
        out = []
        for (task, bucket), group in sorted(self.view().items()):
            rows = {}
            for name in sorted(group.backends):
                s = group.current(name, self.decay)
                assert s is not None
                if not s.requests:  # a probe's mark (mark_probed), nothing learnt yet
                    continue
                rows[name] = {
                    "speed_tps": round(s.speed_tps, 2),
                    "weight": round(s.weight, 2),
                    "requests": s.requests,
                    "acceptance_rate": _round(s.acceptance_rate),
                    "mean_acceptance_length": _round(s.mean_acceptance_length),
                }
            if rows:
                out.append({"task": task, "bucket": bucket, "count": group.count, "backends": rows})
        return out


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)
