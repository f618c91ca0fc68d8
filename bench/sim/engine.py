"""A simulated vLLM engine: continuous batching on a simulated GPU that servers share.

:class:`Gpu` runs one step at a time (an ``asyncio.Lock``, first come first served): servers
on one GPU time-slice it and their steps never overlap, which is what the twin run measured
(chat routed only to plain through the gateway ran at 7.2 ms a token while ngram and EAGLE-3
had work, 3.9 ms with plain alone; docs/benchmarks.md section 7). :class:`Engine` is one
server: requests pass a serial front end (``admit_ms`` each) and a fixed latency, wait, are
prefilled in the next step (one token; a prompt the server's prefix cache holds costs no
prefill), then every step (its time from the profile by the
requests in the server) gives each running request ``1 + accepted`` tokens, accepted drawn
from the profile's acceptance model for the request's task and temperature, and the
speculative counters vLLM exports are kept.

Time: a :class:`Clock` maps simulated seconds to the event loop's seconds by ``scale`` (real
seconds per simulated second: 1 is real time, 4 runs four times slower, which leaves a busy
gateway the CPU to keep up). Steps and admissions are timed on logical simulated times (a
step starts at the end of the one before or when its request became ready, whichever is
later), and the loop only sleeps until those times, so loop lateness does not add up (below
``LATE_S``); the times recorded on each request are the logical ones.

CPU cost: one sleep per step per server and one queue put per running request per step; no
tokens are generated.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from bench.sim.profile import KindProfile, SimProfile

#: Loop lateness (real seconds) past which a step starts when the loop got to it, not at its
#: logical start time (below it, a late loop catches up: its steps end at their logical
#: times, some already past, so their chunks leave in a burst, as after a stall).
LATE_S = 1.0
#: Prompts a server keeps in its prefix cache (LRU; whole prompts, by :func:`prompt_key`).
PREFIX_CACHE_PROMPTS = 4096


class Clock:
    """Simulated seconds on the running loop's clock, ``scale`` real seconds per simulated
    second (must be > 0)."""

    def __init__(self, scale: float = 1.0) -> None:
        if scale <= 0:
            raise ValueError("time scale must be > 0")
        self.scale = scale

    def now(self) -> float:
        """Simulated seconds (the loop's monotonic clock divided by ``scale``)."""
        return asyncio.get_running_loop().time() / self.scale

    async def sleep_until(self, t: float) -> None:
        """Sleep until simulated time ``t`` (returns at once if it has passed)."""
        delay = (t - self.now()) * self.scale
        if delay > 0:
            await asyncio.sleep(delay)


class Gpu:
    """One simulated GPU: steps of its servers run one at a time, in the order they asked."""

    def __init__(self, clock: Clock, name: str = "gpu0") -> None:
        self.clock, self.name = clock, name
        self._lock = asyncio.Lock()
        self._free_at = 0.0
        self.busy_s = 0.0  # simulated seconds of steps run

    async def compute(self, ready_at: float, seconds: float) -> float:
        """Hold the GPU for ``seconds`` of simulated time, starting when both the caller (at
        simulated time ``ready_at``) and the GPU are free; returns the end time. Starts are
        logical times: loop lateness does not add up, unless the loop fell more than
        ``LATE_S`` behind (then the step starts now)."""
        async with self._lock:
            start = max(ready_at, self._free_at)
            now = self.clock.now()
            if now - start > LATE_S / self.clock.scale:
                start = now
            self._free_at = start + seconds
            self.busy_s += seconds
            await self.clock.sleep_until(self._free_at)
            return self._free_at


@dataclass
class SimRequest:
    """One generation: its task and temperature (for acceptance), prompt tokens, the tokens
    it will produce (``target``), and what happened to it. ``steps`` receives the tokens of
    each step (0 ends the stream)."""

    task: str
    temperature: float
    prompt_tokens: int
    target: int
    prompt_key: str
    arrival: float = 0.0
    ready_at: float = 0.0
    first_token_at: float | None = None
    finished_at: float | None = None
    produced: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    spec_steps: int = 0
    histogram: list[int] = field(default_factory=list)
    cancelled: bool = False
    steps: asyncio.Queue[int] = field(default_factory=asyncio.Queue)


@dataclass
class SpecCounters:
    """vLLM's cumulative speculative-decoding counters of one server."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)


class Engine:
    """One simulated vLLM server of ``kind`` on ``gpu``.

    ``k`` overrides the kind's speculative tokens (cost scaled, see
    :meth:`bench.sim.profile.StepCost.step`); ``max_num_seqs`` caps the running batch (vLLM's
    flag of that name); ``seed`` seeds the acceptance draws. ``prefix_cache`` False runs it as
    vLLM's ``--no-enable-prefix-caching`` does: every request pays its whole prefill
    (``prefill_ms_per_token`` x its prompt tokens, simulated ms), a repeated prompt too; True
    (the default) keeps the last :data:`PREFIX_CACHE_PROMPTS` prompts, whose repeats cost no
    prefill.
    """

    def __init__(
        self,
        name: str,
        kind: KindProfile,
        gpu: Gpu,
        *,
        plain: KindProfile | None = None,
        k: int | None = None,
        max_num_seqs: int = 256,
        seed: int = 0,
        prefix_cache: bool = True,
    ) -> None:
        self.name, self.kind, self.gpu = name, kind, gpu
        self.k = kind.cost.k if k is None else k
        self._plain = plain
        self.max_num_seqs = max_num_seqs
        self.prefix_cache = prefix_cache
        self.rng = random.Random(seed)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.spec = SpecCounters(accepted_per_pos=[0] * self.k) if self.k else None
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.requests_total = 0
        self.inflight = 0  # requests between arrival and their last token
        self._front_free_at = 0.0
        self._last_end = 0.0
        self._cache: OrderedDict[str, None] = OrderedDict()
        self._work = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None

    @property
    def speculative(self) -> bool:
        """Whether this server drafts (k > 0 and an acceptance model)."""
        return self.k > 0 and self.kind.acceptance is not None

    async def generate(self, req: SimRequest) -> AsyncIterator[int]:
        """Run ``req``; yields the tokens of each step as they come (first: 1, the prefill's
        token). Leaving early (the client went away) aborts the request."""
        clock = self.gpu.clock
        cost = self.kind.cost
        req.arrival = clock.now()
        self.requests_total += 1
        self.inflight += 1
        admitted = max(req.arrival, self._front_free_at) + cost.admit_ms / 1000
        self._front_free_at = admitted
        req.ready_at = admitted + cost.latency_ms / 1000
        try:
            await clock.sleep_until(req.ready_at)
            self.waiting.append(req)
            self._ensure_loop()
            while True:
                n = await req.steps.get()
                if n == 0:
                    break
                yield n
        finally:
            req.cancelled = True  # no-op when finished; else the engine drops it
            self.inflight -= 1

    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._run())
        self._work.set()

    async def close(self) -> None:
        """Stop the step loop."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task

    async def _run(self) -> None:
        while True:
            if not self.waiting and not self.running:
                self._work.clear()
                await self._work.wait()
            await self._step()

    def _cached(self, key: str) -> bool:
        """Whether the prefix cache holds the prompt ``key`` (then it is the most recent);
        always False with the cache off."""
        if not self.prefix_cache:
            return False
        hit = key in self._cache
        self._cache[key] = None
        self._cache.move_to_end(key)
        if len(self._cache) > PREFIX_CACHE_PROMPTS:
            self._cache.popitem(last=False)
        return hit

    async def _step(self) -> None:
        self.running = [r for r in self.running if not r.cancelled]
        new: list[SimRequest] = []
        while self.waiting and len(self.running) + len(new) < self.max_num_seqs:
            r = self.waiting.popleft()
            if not r.cancelled:
                new.append(r)
        if not self.running and not new:
            return
        cost = self.kind.cost
        prefill = sum(r.prompt_tokens for r in new if not self._cached(r.prompt_key))
        self.prompt_tokens_total += sum(r.prompt_tokens for r in new)
        plain = self._plain.cost if self._plain is not None else None
        ms = cost.step(max(self.inflight, len(self.running) + len(new)), self.k, plain)
        ms += cost.prefill_ms_per_token * prefill
        ready = self._last_end
        if not self.running:
            ready = max(ready, min(r.ready_at for r in new))
        host = ms * cost.host_share / 1000
        if host:
            await self.gpu.clock.sleep_until(ready + host)
        now = self._last_end = await self.gpu.compute(ready + host, ms / 1000 - host)
        for r in self.running:
            self._emit(r, self._decode_tokens(r), now)
        for r in new:
            r.first_token_at = now
            self._emit(r, 1, now)
        self.running = [r for r in self.running + new if r.produced < r.target and not r.cancelled]

    def _emit(self, r: SimRequest, n: int, now: float) -> None:
        n = min(n, r.target - r.produced)
        r.produced += n
        self.generation_tokens_total += n
        r.steps.put_nowait(n)
        if r.produced >= r.target:
            r.finished_at = now
            r.steps.put_nowait(0)

    def _decode_tokens(self, r: SimRequest) -> int:
        """1 + the accepted draft tokens of one step of ``r`` (counters updated)."""
        acceptance = self.kind.acceptance
        if not self.speculative or acceptance is None or self.spec is None:
            return 1
        share, p = acceptance.per_token(r.task, r.temperature)
        if self.rng.random() >= share:
            return 1
        accepted = 0
        while accepted < self.k and self.rng.random() < p:
            self.spec.accepted_per_pos[accepted] += 1
            accepted += 1
        self.spec.drafts += 1
        self.spec.draft_tokens += self.k
        self.spec.accepted_tokens += accepted
        r.drafts += 1
        r.draft_tokens += self.k
        r.accepted += accepted
        r.spec_steps += 1
        if len(r.histogram) < self.k + 1:
            r.histogram = [0] * (self.k + 1)
        r.histogram[accepted] += 1
        return 1 + accepted


def prompt_key(text: str) -> str:
    """The SHA-1 hex of a prompt's text (how :class:`PromptBook` and the prefix cache know
    it)."""
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()


class PromptBook:
    """What the simulated world knows about prompts: their task and natural output length.

    ``known`` maps :func:`prompt_key` to (task, tokens); an unknown prompt is ``default_task``
    and gets a length drawn (by its hash) from the profile's lengths of that task, so every
    backend answers a prompt with the same length, as greedy decoding of one target does.
    """

    def __init__(
        self,
        profile: SimProfile,
        known: dict[str, tuple[str, int]] | None = None,
        default_task: str = "chat",
    ) -> None:
        self.profile, self.known, self.default_task = profile, known or {}, default_task

    def lookup(self, text: str) -> tuple[str, str, int]:
        """(key, task, natural output tokens) of the prompt ``text``."""
        key = prompt_key(text)
        if key in self.known:
            task, tokens = self.known[key]
            return key, task, tokens
        lengths = self.profile.task_lengths.get(self.default_task) or (64,)
        return key, self.default_task, lengths[int(key[:8], 16) % len(lengths)]
