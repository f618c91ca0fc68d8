"""Live scoring: the distribution canary also reads the sampled tokens of live traffic.

The canary's own rounds (:mod:`gateway.upstream.sample_canary`) sample a few hundred tokens
per backend an hour; a 1% fault then takes about an hour to show (``bench.sample_canary``).
Live traffic sampled on a speculative backend carries far more evidence. Per speculative
backend, a token bucket of ``tokens_per_minute`` **scored** tokens (what scoring costs: the
plain twin prefills prompt + sampled ids; the sampled ids themselves were decoded for the
client anyway) decides which requests are read:

1. On the request path (:meth:`LiveScorer.attach`, one call from the pipeline): a
   request (JSON or stream) that samples, qualifies (:func:`~gateway.upstream.live_ids.
   qualifies`), goes first to a speculative backend whose bucket is not empty, is sent
   with ``return_token_ids: true`` spliced in (uncompressed); an :class:`~gateway.upstream.
   live_ids.IdsTap` takes the ids out of the answer again, unless the client asked for them itself.
2. The ids go to a bounded queue (full: the sample is dropped and counted), charged to the
   bucket of the backend that answered (a plain backend's answer is not scored).
3. Off the request path, :meth:`LiveScorer.run` scores them under the plain twin exactly
   as the canary scores its own samples (:meth:`SampleCanary.score`) and files them in the
   canary's stream of (backend, temperature band of the request); each stream is judged at
   most once per ``judge_interval_s`` with the canary's test, at a level that counts these
   judgements (:meth:`SampleCanary.alpha`: rounds and live judgements spend half of the
   hourly false-alarm bound each, so it holds for both together), and a failing verdict
   takes the backend off sampled traffic as a round's does
   (:meth:`SampleCanary.apply_verdicts`).

Within a band the analytic null bound holds at any temperature up to 1, and above 1 the
plain reference sampled at the band's upper edge bounds every lower temperature of the band
(tempering down only thins the tail: :mod:`gateway.upstream.sample_stats`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from gateway.classify.features import samples
from gateway.routing.bands import Band, temperature_bands
from gateway.trace import RequestTrace
from gateway.upstream.canary import plain_twin
from gateway.upstream.feedback import ResponseTap
from gateway.upstream.live_ids import IdsTap, qualifies, with_token_ids
from gateway.upstream.sample_canary import HOUR_S, SampleCanary

logger = logging.getLogger(__name__)
#: The endpoints whose answers carry token ids (``RequestTrace.endpoint`` form: a path).
SCORED_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
Wrap = Callable[[ResponseTap | None], ResponseTap | None]


def unchanged(tap: ResponseTap | None) -> ResponseTap | None:
    """The :data:`Wrap` of a request live scoring does not take."""
    return tap


@dataclass(frozen=True, slots=True)
class LiveScoringBudget:
    """``tokens_per_minute``: scored tokens (prompt + sampled) per speculative backend and
    minute, the bucket holding at most a minute's worth; ``queue``: samples waiting to be
    scored (more are dropped); ``judge_interval_s``: the least time between two judgements
    of one stream."""

    tokens_per_minute: float = 2000.0
    queue: int = 64
    judge_interval_s: float = 60.0


@dataclass(frozen=True, slots=True)
class _Sample:
    backend: str
    temperature: float
    request: str
    prompt_ids: list[int]
    ids: list[int]


class LiveScorer:
    """Live scoring for one app (module docstring): the buckets, the queue, the worker.
    ``clock`` gives unix time (the evidence's and the window's), ``monotonic`` the
    buckets' time; both are injectable for simulated time."""

    def __init__(
        self,
        canary: SampleCanary,
        budget: LiveScoringBudget,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.canary, self.budget = canary, budget
        self.clock, self.monotonic = clock, monotonic
        self.queue: asyncio.Queue[_Sample] = asyncio.Queue(maxsize=budget.queue)
        self.buckets: dict[str, tuple[float, float]] = {}  # backend: (tokens, at)
        self.counts: Counter[str] = Counter()
        self.costs: deque[tuple[float, int, int, float]] = deque()  # time, sampled, scored, s
        self.judged: dict[tuple[str, str], float] = {}  # stream: last live judgement
        self.dirty: set[tuple[str, Band]] = set()
        self._bands: tuple[object, dict[str, list[Band]]] | None = None
        canary.live_judgements_per_hour = HOUR_S / budget.judge_interval_s
        canary.live = self.to_json

    def bands(self) -> dict[str, list[Band]]:
        """The canary's bands of the current config (computed once per config)."""
        config = self.canary.config()
        if self._bands is None or self._bands[0] is not config:
            self._bands = (config, temperature_bands(config))
        return self._bands[1]

    def _level(self, backend: str) -> float:
        """The backend's bucket now (refilled at ``tokens_per_minute``, capped at a
        minute's worth)."""
        rate, now = self.budget.tokens_per_minute, self.monotonic()
        tokens, at = self.buckets.get(backend, (rate, now))
        level = min(rate, tokens + rate * (now - at) / 60.0)
        self.buckets[backend] = (level, now)
        return level

    def attach(
        self, path: str, body: Any, raw: bytes, first: str, trace: RequestTrace
    ) -> tuple[bytes, Wrap] | None:
        """On the request path: ``(raw, wrap)`` for a request the bucket of ``first`` (its
        first backend) takes, else None. ``raw`` is the body to send (the flag spliced in
        unless the client set it), ``wrap`` wraps each response tap in an
        :class:`~gateway.upstream.live_ids.IdsTap`."""
        config = self.canary.config()
        backend = config.backends.get(first)
        if path not in SCORED_PATHS or backend is None or not backend.spec.speculative:
            return None
        if not isinstance(body, dict) or not samples(body, config.defaults.temperature):
            return None
        self.counts["offered"] += 1
        if not qualifies(body):
            self.counts["not_qualified"] += 1
            return None
        if self._level(first) <= 0:
            self.counts["over_budget"] += 1
            return None
        keep = "return_token_ids" in body
        sent = raw if keep else with_token_ids(raw)
        if sent is None:
            return None
        try:
            given = body.get("temperature")
            t = config.defaults.temperature if given is None else float(given)
        except (TypeError, ValueError):
            return None  # the backend refuses it
        self.counts["asked"] += 1

        def sink(trace: RequestTrace, prompt_ids: list[int], ids: list[int]) -> None:
            self.offer(trace, t, prompt_ids, ids)

        def wrap(tap: ResponseTap | None) -> ResponseTap | None:
            return IdsTap(trace, tap, keep=keep, sink=sink)

        return sent, wrap

    def offer(
        self, trace: RequestTrace, temperature: float, prompt: list[int], ids: list[int]
    ) -> None:
        """Queue an answer's ids for scoring (not the request path's business: never blocks,
        never raises); only a speculative backend's answer is kept, and charged to its
        bucket."""
        name = trace.backend or ""
        backend = self.canary.config().backends.get(name)
        if backend is None or not backend.spec.speculative or not ids:
            self.counts["not_speculative"] += 1
            return
        level = self._level(name)
        self.buckets[name] = (level - len(prompt) - len(ids), self.monotonic())
        try:
            self.queue.put_nowait(_Sample(name, temperature, trace.request_id, prompt, ids))
        except asyncio.QueueFull:
            self.counts["dropped_queue_full"] += 1
            return
        self.counts["queued"] += 1

    async def score_one(self, sample: _Sample) -> None:
        """Score one sample under the plain twin and file it in its stream (counted as
        ``scored``, or ``no_band``/``no_twin``/``failed``)."""
        config, bands = self.canary.config(), self.bands().get(sample.backend, [])
        band = next((b for b in bands if b.low < sample.temperature <= b.high), None)
        if band is None:
            self.counts["no_band"] += 1
            return
        model = config.backends[sample.backend].served_model
        twin = plain_twin(config, self.canary.registry, model)
        if twin is None:
            self.counts["no_twin"] += 1
            return
        started = time.monotonic()
        scored = await self.canary.score(
            config.backends[twin], sample.prompt_ids, sample.ids, -1, sample.request
        )
        now = self.clock()
        cost = len(sample.ids) + len(sample.prompt_ids)
        self.costs.append((now, len(sample.ids), cost, time.monotonic() - started))
        if isinstance(scored, str):
            self.counts["failed"] += 1
            logger.info("live scoring on %s failed: %s", twin, scored)
            return
        self.counts["scored"] += 1
        c = self.canary
        stream = c.stream(sample.backend, band)
        stream.add(now, [scored], c.budget.floor, band.label, sample.temperature)
        self.dirty.add((sample.backend, band))

    def judge_due(self) -> None:
        """Judge every stream with new live samples whose last live judgement is at least
        ``judge_interval_s`` old, then set the backends' verdicts."""
        now, bands = self.clock(), self.bands()
        due = [
            (name, band)
            for name, band in self.dirty
            if now - self.judged.get((name, band.label), -HOUR_S) >= self.budget.judge_interval_s
        ]
        if not due:
            return
        alpha = self.canary.alpha(bands, live=True)
        for name, band in due:
            self.dirty.discard((name, band))
            self.judged[(name, band.label)] = now
            if band in bands.get(name, []):
                self.canary.judge(name, band, alpha)
        self.canary.apply_verdicts(bands)
        while self.costs and self.costs[0][0] < now - HOUR_S:
            self.costs.popleft()

    async def drain(self) -> None:
        """Score everything queued now, then judge what is due (the worker's step)."""
        while not self.queue.empty():
            try:
                await self.score_one(self.queue.get_nowait())
            finally:
                self.queue.task_done()
        self.judge_due()

    async def run(self) -> None:
        """The worker: score samples as they come, judge at least every
        ``judge_interval_s``; cancelled at shutdown."""
        while True:
            try:
                async with asyncio.timeout(self.budget.judge_interval_s):
                    sample = await self.queue.get()
                try:
                    await self.score_one(sample)
                finally:
                    self.queue.task_done()  # queue.join() waits for this
            except TimeoutError:
                pass
            except Exception:  # a bad sample must not end live scoring
                logger.exception("live scoring failed on a sample")
            self.judge_due()

    def to_json(self) -> dict[str, Any]:
        """Budget, counters, queue and cost for ``/routes`` (and the canary's cost)."""
        now = self.clock()
        recent = [c for c in self.costs if c[0] >= now - HOUR_S]
        return {
            "budget": asdict(self.budget),
            "counts": dict(self.counts),
            "queued": self.queue.qsize(),
            "buckets": {n: round(self._level(n), 1) for n in sorted(self.buckets)},
            "cost_last_hour": {
                "live_requests": len(recent),
                "live_sampled_tokens": sum(c[1] for c in recent),
                "live_scored_tokens": sum(c[2] for c in recent),
                "live_seconds": round(sum(c[3] for c in recent), 3),
            },
        }
