"""The routing policy: from request features and live backend state to an ordered try list.

Pure code: no HTTP, no I/O, no clock. Randomness (tie breaks, probe traffic) comes from the
caller's ``random.Random``, so a decision is deterministic for a given state and seed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from contracts.config import BackendConfig, GatewayConfig, Rule
from gateway.classify.features import SPECULATION_OFF, SPECULATION_ON, RequestFeatures
from gateway.routing.adaptive import ALL, Estimates, bucket_of
from gateway.routing.adaptive_choice import AdaptiveChoice, choose
from gateway.routing.load import (
    LoadView,
    compute_peers,
    load_view,
    measured_at_load,
    observed_at_load,
)
from gateway.routing.rules import first_match
from gateway.speculation.prompt_stats import PromptStats

DEFAULT_RULE = "default"
#: Pool label of plain backends added because speculative ones were passed over.
PLAIN_FALLBACK = "plain (speculation passed over)"
#: Pool label of backends outside the rule's pools, used when every one of those is out.
LAST_RESORT = "last resort"
#: Why a speculative backend is left out of a request asking ``X-Specgate-Speculation: off``.
OFF_WHY = "speculation off (requested)"
#: Factor on ``max_batch_for_speculation`` for a speculative backend that holds most of this
#: gateway's requests in flight on a ``compute_group`` it shares (LoadView.bursts): a burst
#: that started there stays together. On the GPU cost twin (docs/benchmarks.md section 7) a
#: wave of 4 split over EAGLE-3 and plain on one H200 took 0.46-0.51 s against 0.27-0.29 s
#: on one server (~1.7x), while EAGLE-3 alone at twice its limit (c=8) ran at 0.92-1.08x
#: plain: past the limit a burst loses less by staying than by splitting. Stale
#: ``/metrics`` counts of other clients' finished requests pushed such bursts over the limit
#: halfway (simulator, session 13).
LEADER_SLACK = 2


class CohortMember(NamedTuple):
    """A request that arrived with the one being routed and waits for it (a cohort,
    :mod:`gateway.arrivals`): what the policy reads of it to choose for the cohort;
    ``seeded``: a seeded request that samples, pinned whatever the choice
    (:mod:`gateway.routing.seeds`)."""

    features: RequestFeatures
    prompt: PromptStats | None
    seeded: bool = False


@dataclass(frozen=True, slots=True)
class BackendSnapshot:
    """A backend's live state as routing sees it.

    ``circuit_open``: its circuit breaker refuses requests now (open, or half-open with the
    probe under way); ``inflight``: this gateway's requests in flight there;
    ``running``/``waiting``: other clients' requests running and queued there (its
    ``/metrics`` scrapes less this gateway's, aged:
    :meth:`~gateway.upstream.state.BackendState.foreign_load`);
    ``demoted``: its windowed acceptance rate is under its floor; ``acceptance_rate``: that
    rate (None if unknown); ``suspect``: why the correctness canary stopped trusting it
    (None when trusted); ``sample_suspect``: why the distribution canary stopped trusting
    its sampled output (kept from requests with temperature > 0; None when trusted);
    ``recent``: the most of this gateway's requests in flight there at once over the last
    10-20 s (:data:`gateway.upstream.state.PEAK_WINDOW_S`; 0: none), the load a burst brings.
    """

    healthy: bool
    circuit_open: bool = False
    inflight: int = 0
    recent: float = 0.0
    running: float = 0.0
    waiting: float = 0.0
    demoted: bool = False
    acceptance_rate: float | None = None
    suspect: str | None = None
    sample_suspect: str | None = None

    @property
    def outstanding(self) -> float:
        """Requests ahead of a new one: gateway in-flight plus other clients' queued ones."""
        return self.inflight + self.waiting

    @property
    def batch(self) -> float:
        """The backend's batch as best known: this gateway's requests in flight (exact) and
        other clients' (scraped, aged)."""
        return self.inflight + self.running + self.waiting


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
    considered with the reason it was kept or passed over; ``reasons`` explains the choice;
    ``saturated`` says a backend was left out only for being at its ``max_inflight`` cap
    (with an empty try list the caller answers 429 rather than 503); ``adaptive`` holds
    the estimates behind an adaptive choice (None under the static policy);
    ``concurrency``: requests on the chosen backend's compute when it was chosen, this one
    included (its ``compute_group``'s batch, or recent peak less one, plus its share of the
    requests arriving with it, + 1; what the learner files the answer under);
    ``guarded``: (backend, guard) pairs the known-engine-bug guards took out of the try
    list (:func:`gateway.routing.guards.apply_guards`);
    ``outside``: the try list's backends from outside the rule's pools (step 7);
    ``last_resort``: why they lead it (every backend of the rule's pools was out), None when
    they are only failover targets after the rule's own;
    ``speculation``: the effect of the request's ``X-Specgate-Speculation`` for the answer's
    header of that name (None: no header; set once the decision is final,
    :func:`gateway.routing.control.outcome`);
    ``probe``: (backend, bucket) when the choice is a speculative backend kept past its
    ``max_batch_for_speculation`` to measure it there (:meth:`RoutingPolicy._probes`; the
    gateway marks it sent), else None.
    """

    rule: str
    pool: str
    features: RequestFeatures
    backends: tuple[str, ...]
    candidates: tuple[Candidate, ...]
    reasons: tuple[str, ...] = field(default=())
    saturated: bool = False
    adaptive: AdaptiveChoice | None = None
    concurrency: float = 1.0
    guarded: tuple[tuple[str, str], ...] = ()
    last_resort: str | None = None
    outside: tuple[str, ...] = ()
    speculation: str | None = None
    probe: tuple[str, str] | None = None

    @property
    def backend(self) -> str | None:
        """The chosen backend, or None when no candidate is usable."""
        return self.backends[0] if self.backends else None


@dataclass(slots=True)
class _Plan:
    kept: list[tuple[float, float, str]] = field(default_factory=list)
    deferred: list[str] = field(default_factory=list)
    candidates: list[Candidate] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    saturated: bool = False
    # whether a speculative backend's and a plain one's speeds were learnt at this load
    measured: Callable[[str], bool] | None = None
    # whether a backend was observed (or probed) for the request's task: at any load
    # (True), or in the request's bucket at this load (False)
    observed: Callable[[str, bool], bool] | None = None
    # the rule's own pool, the requests arriving with this one per backend (its compute
    # unit's share), and the speculative backends kept to measure them
    pool: str = ""
    arriving: Mapping[str, float] = field(default_factory=dict)
    probes: set[str] = field(default_factory=set)
    # the requests on each backend's compute before this one, and where bursts of ours run
    load: LoadView = field(default_factory=lambda: LoadView({}, frozenset()))
    # the cohort waiting for this request's choice
    cohort: Sequence[CohortMember] = ()


class RoutingPolicy:
    """Decides, for one request, the rule, the pool and the ordered backends to try.

    1. The first matching rule gives pools: its pool, then its fallbacks (no match: the
       default pool).
    2. Backends that are unknown, unhealthy or serve another model are dropped, and so
       are those the greedy canary suspects and, for a request with temperature > 0,
       those the distribution canary suspects (``sample_suspect``).
    3. Speculative backends whose method refuses a parameter of the request
       (``features.spec_refused``), over ``max_batch_for_speculation`` (the batch of their
       compute group, or its recent peak; load-aware: vLLM measured 1.4-1.8x slowdowns from
       speculation at high QPS; :data:`LEADER_SLACK` times it for the one a burst of this
       gateway's requests runs on) or demoted for low acceptance are
       passed over: plain backends serving the model are tried first, the passed-over ones
       stay last-resort failover targets. A demoted backend still takes ``probe_share`` of
       its traffic so its recovery shows.
    4. Within a pool: least outstanding requests first, ties broken at random.
    5. Under ``policy: adaptive`` (the rule's, else ``routing.policy``) and given learnt
       ``estimates``, the kept candidate of the rule's pool, or plain one of its fallbacks,
       with the best expected speed goes first (Thompson sampling, see
       :mod:`gateway.routing.adaptive_choice`); the rest keep their order for failover.
       Once a speculative backend and a plain one were both measured at this request's load
       band, their learnt speeds replace ``max_batch_for_speculation`` in step 3 (for a
       backend not holding a burst of ours, up to :data:`LEADER_SLACK` times it). Until
       then such a backend, never observed for the task at that load, stays a candidate
       there for the first request of a cohort on an idle compute unit, once per (task,
       bucket, band): the probe of :meth:`_probes`.
       Replicas (one served model, the same speculation settings) enter the choice as
       one: the least loaded of them (:meth:`_least_loaded_replicas`), judged, until it was
       observed for the task, on the replica observed most for it
       (:func:`~gateway.routing.adaptive_choice.stand_in`).
    6. Shared compute (:mod:`gateway.routing.load`): a candidate whose ``compute_group`` is
       busy, other than its leading backend (most of this gateway's requests in flight, then
       the largest batch), would spread load over competing servers; its
       expected speed is discounted by ``routing.shared_compute_penalty`` and nothing is
       explored (adaptive; an idle group's choice explores less the larger its recent burst),
       or a busy candidate goes before an idle one (static, and adaptive while nothing was
       measured for the task: the rules' choice is then kept together as static keeps it).
    7. Last resort: every other backend serving the model that could take the request
       (healthy, circuit closed, trusted, under its cap, and no speculation method refusing
       the request's parameters), plain ones first, then least outstanding, ends the try
       list: failover targets when the rule's own backends fail before answering, and the
       whole list when steps 1-3 leave nothing (every backend of the rule's pools and
       fallbacks down, its circuit open, suspect or at its cap; the decision then says why
       in ``last_resort``). Known-engine-bug guards still apply to them (the caller's step).
    8. The request's ``X-Specgate-Speculation`` (``features.speculation``,
       :mod:`gateway.routing.control`): ``off`` leaves every speculative backend out (plain
       backends serving the model take its place, as in step 3); ``on`` skips step 3's speed
       judgements (batch limit, demotion; never a refused parameter) and puts the
       speculative backends of the try list first, those outside the rule's pools included.
    """

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.groups = {n: b.compute_group for n, b in config.backends.items()}
        self.plain = [n for n, b in config.backends.items() if not b.spec.speculative]
        # per config, so a decision reads sets instead of each backend's speculation settings
        self.speculative = frozenset(config.backends).difference(self.plain)
        # the other servers on each backend's compute (empty without a compute_group)
        self.peers = compute_peers(self.groups)
        # replicas: backends serving one model with the same speculation settings
        self.kinds = {
            n: (b.served_model, b.spec.model_dump_json()) for n, b in config.backends.items()
        }
        self.replicated = len(set(self.kinds.values())) < len(self.kinds)
        # per backend, the other replicas of its kind: what one learnt stands for the others
        self.alike = {
            n: tuple(m for m, k in self.kinds.items() if k == kind and m != n)
            for n, kind in self.kinds.items()
        }
        # per served model: its backends, and the compute units they run on (``unit_of``: a
        # compute group counts once, a backend without one is its own)
        self.serving: dict[str, tuple[str, ...]] = {}
        for n, b in config.backends.items():
            self.serving[b.served_model] = (*self.serving.get(b.served_model, ()), n)
        self.unit_of = {n: g or f"backend {n}" for n, g in self.groups.items()}
        self.units = {
            model: len({self.unit_of[n] for n in names}) for model, names in self.serving.items()
        }
        self.caps = {model: self._cohort_cap(model) for model in self.serving}
        # per model: the recent peak a compute unit may show and a burst still form a cohort
        self.unit_caps = {m: (c - 1) / self.units[m] for m, c in self.caps.items()}

    def cohort_cap(self, model: str) -> int:
        """Requests of ``model`` arriving together past which a larger burst routes alike:
        enough that the cohort's first request sees each compute unit serving the model take
        more than the highest ``max_batch_for_speculation`` x :data:`LEADER_SLACK` of its
        speculative backends beside it (every speculative backend passed over, learnt speeds
        or not: :meth:`_pass_over`), plus the first itself; 2 when none has a limit (learnt
        speeds per load band decide); 1 (no cohort) when no speculative backend serves it,
        or it is not served. (Until session 39 it was one less: a wave of 48 on the GPU
        twin formed cohorts of 33, whose first saw 32 beside it, within twice EAGLE-3's
        limit of 16.)"""
        return self.caps.get(model, 1)

    def _cohort_cap(self, model: str) -> int:
        if not any(n in self.speculative for n in self.serving.get(model, ())):
            return 1  # nothing to decide between: no cohort
        limits = [
            b.max_batch_for_speculation
            for n in self.serving.get(model, ())
            if (b := self.config.backends[n]).max_batch_for_speculation is not None
        ]
        if not limits:
            return 2
        return self.units.get(model, 1) * max(limits) * LEADER_SLACK + 2

    def decide(
        self,
        features: RequestFeatures,
        state: Mapping[str, BackendSnapshot],
        rng: random.Random,
        estimates: Estimates | None = None,
        prompt: PromptStats | None = None,
        arriving: int = 0,
        cohort: Sequence[CohortMember] = (),
    ) -> RouteDecision:
        """Route one request. Never raises for a valid config; an empty ``backends`` means
        no usable backend (the caller answers 503). ``estimates`` (read only) and
        ``prompt`` feed the adaptive policy. ``arriving``: other requests of the model that
        arrived with this one and are not routed yet (:mod:`gateway.arrivals`); each compute
        unit serving the model counts its share of them as load (rounded up), so a burst's
        first request is routed for the burst. ``cohort``: those of them waiting for this
        one's choice (it formed their cohort); when they all share its compute unit (one
        usable), an adaptive choice on an idle compute is then made for their mix of tasks
        (:func:`~gateway.routing.adaptive_choice.choose`'s ``cohort``: each in its own task
        and bucket, the rules and the load being this request's)."""
        rule = first_match(self.config.rules, features)
        pools, policy = self._routes(rule)
        if rule is None:
            rule_name, reasons = DEFAULT_RULE, ["no rule matched: default pool"]
        else:
            rule_name = rule.name
            reasons = [
                f"rule '{rule.name}' matched (task={features.task}, "
                f"temperature={features.temperature:g})"
            ]
        learnt = estimates if policy == "adaptive" else None
        extra: dict[str, float] = {}
        units = 1
        if arriving > 0:  # shared over the compute units that can take a request now
            usable = [
                n for n in self.serving.get(features.model, ()) if self._usable(n, features, state)
            ]
            units = len({self.unit_of[n] for n in usable}) or 1
            share = -(-arriving // units)
            extra = dict.fromkeys(usable, float(share))
            reasons.append(
                f"arriving together: {arriving} more request(s) of the model, "
                f"{share} per compute unit counted as load"
            )
        load = load_view(
            self.groups,
            {n: snap.batch for n, snap in state.items()},
            {n: snap.recent for n, snap in state.items()},
            {n: snap.inflight for n, snap in state.items()},
            extra,
        )
        settings = self.config.routing.adaptive
        overlap = prompt.overlap if prompt is not None else None
        plan = _Plan(reasons=reasons, load=load, pool=pools[0], arriving=extra)
        buckets: dict[str, str] = {}
        if learnt is not None:
            buckets = self._buckets(load, features.temperature, overlap)

            def measured(name: str) -> bool:
                return measured_at_load(
                    learnt,
                    features.task,
                    buckets,
                    name,
                    self.plain,
                    min_weight=settings.min_load_weight,
                    decay=settings.decay,
                    alike=self.alike[name],
                )

            def observed(name: str, anywhere: bool) -> bool:
                bucket = ALL if anywhere else buckets[name]
                return observed_at_load(
                    learnt,
                    features.task,
                    bucket,
                    name,
                    decay=settings.decay,
                    alike=self.alike[name],
                )

            plan.measured, plan.observed = measured, observed
            # on one compute unit the cohort runs where its first request goes; spread over
            # several, each unit's first request chooses for its share, alone
            if units == 1:
                plan.cohort = [m for m in cohort if self._follows(m, features, (pools, policy))]
        order: list[str] = []
        for pool in pools:
            plan.kept = []
            for name in self.config.pools.get(pool, []):
                self._consider(name, pool, features, state, rng, plan)
            order.extend(name for _, _, name in sorted(plan.kept))
        if plan.deferred or features.speculation == SPECULATION_OFF:
            order.extend(self._plain_backends(features, state, rng, plan, order))
            order.extend(plan.deferred)
        last_resort = None
        outside = self._last_resort(features, state, rng, plan, bool(order))
        if outside and not order:
            last_resort = _out_reason(pools, plan.candidates)
            plan.reasons.append(f"last resort: {last_resort}")
        adaptive = None
        eligible = self._eligible(pools[0], plan, order)
        order.extend(outside)
        if learnt is not None and eligible:
            adaptive = self._adapt(
                features, buckets, load, learnt, rng, plan, order, eligible, extra
            )
        elif eligible:
            _keep_together(load, plan, order, eligible)
        if features.speculation == SPECULATION_ON:
            order, outside = self._speculation_first(order, outside, plan)
        chosen = order[0] if order else None
        return RouteDecision(
            rule=rule_name,
            pool=pools[0],
            features=features,
            backends=tuple(order),
            candidates=tuple(plan.candidates),
            reasons=tuple(plan.reasons),
            saturated=plan.saturated,
            adaptive=adaptive,
            concurrency=load.concurrency.get(chosen, 0.0) + 1 if chosen else 1.0,
            last_resort=last_resort,
            outside=tuple(outside),
            probe=(chosen, buckets[chosen]) if chosen in plan.probes else None,
        )

    def _eligible(self, pool: str, plan: _Plan, order: list[str]) -> list[str]:
        """The try list's backends a policy may put first: kept candidates of the rule's
        own pool, and plain ones of its fallbacks (rules stay the guard rails)."""
        allowed = {
            c.backend
            for c in plan.candidates
            if c.kept and (c.pool == pool or c.backend not in self.speculative)
        }
        return [name for name in order if name in allowed]

    def _adapt(
        self,
        features: RequestFeatures,
        buckets: Mapping[str, str],
        load: LoadView,
        estimates: Estimates,
        rng: random.Random,
        plan: _Plan,
        order: list[str],
        eligible: list[str],
        arriving: Mapping[str, float],
    ) -> AdaptiveChoice:
        """Move the adaptive pick among ``eligible`` to the front of ``order`` (in place);
        ``arriving``: per backend, its share of the requests arriving with this one."""
        settings = self.config.routing.adaptive
        penalty = self.config.routing.shared_compute_penalty
        if self.replicated:
            eligible = self._least_loaded_replicas(eligible, load, plan)
        penalties = {n: penalty for n in eligible if n in load.spreads | load.followers}
        choice = choose(
            features.task,
            buckets,
            eligible,
            estimates,
            rng,
            decay=settings.decay,
            prior_weight=settings.prior_weight,
            baseline=self.plain[0] if self.plain else None,
            penalties=penalties,
            explore=_exploration(penalties, load, eligible, arriving),
            replicas=self.alike if self.replicated else None,
            cohort=() if penalties or len(eligible) < 2 else self._mix(plan.cohort, load),
        )
        order.remove(choice.chosen)
        order.insert(0, choice.chosen)
        if choice.untried and order[0] in load.spreads:  # kept together as static keeps it
            _keep_together(load, plan, order, eligible)
            choice = replace(choice, chosen=order[0], best=order[0], bucket=buckets[order[0]])
        why = "exploring" if choice.explored else "best expected speed"
        if choice.second:
            why = "its second answer in this bucket (one so far)"
        if choice.cohort:
            mix = ", ".join(f"{t} {k}" for t, k in sorted(choice.cohort.items()))
            why += f" for the {sum(choice.cohort.values())} requests arriving together ({mix})"
        if choice.untried:
            why = "nothing measured yet: the rules' choice"
        plan.reasons.append(f"adaptive ({choice.bucket}): {choice.chosen}, {why}")
        spread = sorted((load.spreads | load.followers).intersection(eligible))
        if spread:
            plan.reasons.append(
                f"shared compute: {', '.join(spread)} not leading their busy compute "
                f"(expected speed x{penalty:g})"
            )
        return choice

    def _buckets(self, load: LoadView, temperature: float, overlap: float | None) -> dict[str, str]:
        """Per backend, the feature bucket of a request of ``temperature`` and prompt
        ``overlap`` at the load on its compute (``load``; one bucket per load value)."""
        threshold = self.config.routing.adaptive.overlap_threshold
        by_load: dict[float, str] = {}
        buckets: dict[str, str] = {}
        for n, c in load.concurrency.items():
            bucket = by_load.get(c)
            if bucket is None:
                bucket = by_load[c] = bucket_of(temperature, overlap, threshold, c + 1)
            buckets[n] = bucket
        return buckets

    def _mix(
        self, cohort: Sequence[CohortMember], load: LoadView
    ) -> list[tuple[str, Mapping[str, str]]]:
        """Per request of a ``cohort`` (whose choice it waits for), its task and its bucket
        per backend at the loads the first request sees (``load``)."""
        alike: dict[tuple[float, float | None], dict[str, str]] = {}
        out: list[tuple[str, Mapping[str, str]]] = []
        for member in cohort:
            t = member.features.temperature
            o = member.prompt.overlap if member.prompt is not None else None
            buckets = alike.get((t, o))
            if buckets is None:
                buckets = alike[t, o] = self._buckets(load, t, o)
            out.append((member.features.task, buckets))
        return out

    def _follows(
        self,
        member: CohortMember,
        first: RequestFeatures,
        routes: tuple[list[str], str],
    ) -> bool:
        """Whether a cohort's ``member`` can follow its ``first`` request's choice (whose
        rule routes among ``routes``' pools by its policy): not when it may go elsewhere
        whatever that choice, as a seeded request that samples (pinned), one a speculation
        method refuses a parameter of, another ``X-Specgate-Speculation``, or a rule
        routing among other pools or by another policy."""
        features = member.features
        return not (
            member.seeded
            or features.spec_refused
            or features.speculation != first.speculation
            or self._routes(first_match(self.config.rules, features)) != routes
        )

    def _routes(self, rule: Rule | None) -> tuple[list[str], str]:
        """The pools a matched ``rule`` routes among, in order (the default pool without
        one), and its policy (the config's routing policy unless the rule sets one)."""
        if rule is None:
            return [self.config.defaults.pool], self.config.routing.policy
        return [rule.pool, *rule.fallbacks], rule.policy or self.config.routing.policy

    def _least_loaded_replicas(self, eligible: list[str], load: LoadView, plan: _Plan) -> list[str]:
        """``eligible`` with one backend per kind (served model and speculation settings
        alike): the one with the fewest requests on its compute now (``load.queued``); on a
        tie, one that leads its compute or has it to itself, then try-list order.

        Replicas are interchangeable, so the adaptive choice is made between kinds and the
        load among replicas of one is balanced (join the shortest queue, as a load balancer
        would). Choosing among replicas by learnt speed instead herded a fleet: with
        exploration off on busy compute, the backend with the best mean took requests
        until its load band changed (simulator, 8 GPUs x plain and EAGLE-3 at c=256: 205
        requests on one GPU, 1-9 on the others; docs/benchmarks.md section 7, session 14).
        The queue decides before sharing: a replica beside a busy server of another kind
        (discounted by ``shared_compute_penalty`` in the choice that follows) is still
        better than one whose own GPU holds many times more (preferring unshared replicas
        first put 194 of 256 requests on the one GPU no EAGLE-3 burst had started on).
        """
        shared = load.spreads | load.followers
        best: dict[tuple[str, str], str] = {}
        alike: dict[tuple[str, str], int] = {}
        for name in eligible:
            kind = self.kinds[name]
            alike[kind] = alike.get(kind, 0) + 1
            held = best.get(kind)
            key = (load.queued.get(name, 0.0), name in shared)
            if held is None or key < (load.queued.get(held, 0.0), held in shared):
                best[kind] = name
        if len(best) == len(eligible):
            return eligible
        for kind, name in best.items():
            if alike[kind] > 1:
                plan.reasons.append(
                    f"replicas: {name} the least loaded of {alike[kind]} alike "
                    f"({load.queued.get(name, 0.0):g} on its compute)"
                )
        chosen = set(best.values())
        return [name for name in eligible if name in chosen]

    def _consider(
        self,
        name: str,
        pool: str,
        features: RequestFeatures,
        state: Mapping[str, BackendSnapshot],
        rng: random.Random,
        plan: _Plan,
    ) -> None:
        backend, snap = self.config.backends.get(name), state.get(name)
        if backend is None or snap is None:
            why: str | None = "unknown backend"
        elif name in plan.seen:
            why = "already a candidate"
        elif backend.served_model != features.model:
            why = f"serves model '{backend.served_model}', not '{features.model}'"
        elif not snap.healthy:
            why = "unhealthy"
        elif snap.circuit_open:
            why = "circuit open"
        elif snap.suspect is not None:
            why = f"suspect: {snap.suspect}"
        elif snap.sample_suspect is not None and features.temperature > 0:
            why = f"sampled output suspect: {snap.sample_suspect}"
        elif backend.max_inflight is not None and snap.inflight >= backend.max_inflight:
            why = f"at its max_inflight of {backend.max_inflight}"
            plan.saturated = True
        else:
            why = None
        if why is not None or backend is None or snap is None:
            plan.candidates.append(Candidate(name, pool, False, why or "unknown backend"))
            return
        if name in self.speculative and features.speculation == SPECULATION_OFF:
            plan.candidates.append(Candidate(name, pool, False, OFF_WHY))
            return
        plan.seen.add(name)
        batch = plan.load.concurrency[name]  # every backend's: >= its own batch
        leads = name in plan.load.bursts
        probe = self._probes(name, backend, pool, features, plan, batch, leads)
        passed_over = self._pass_over(
            name, backend, snap, rng, features, plan.measured, batch, leads, probe is not None
        )
        if passed_over is not None:
            plan.deferred.append(name)
            plan.candidates.append(Candidate(name, pool, False, passed_over))
            plan.reasons.append(f"{name}: {passed_over}")
            return
        plan.kept.append((snap.outstanding, rng.random(), name))
        why = f"healthy, {snap.outstanding:g} outstanding"
        limit = backend.max_batch_for_speculation
        if leads and limit is not None and limit < batch <= limit * LEADER_SLACK:
            why += (
                f"; batch {batch:g} > max_batch_for_speculation {limit}, kept: our burst runs there"
            )
        elif probe is not None:
            plan.probes.add(name)
            why += f"; batch {batch:g} > max_batch_for_speculation {limit}, kept: {probe}"
            plan.reasons.append(f"{name}: probing past max_batch_for_speculation ({probe})")
        if snap.demoted:
            why += f"; demoted but taking its {self.config.routing.probe_share:.0%} probe share"
        plan.candidates.append(Candidate(name, pool, True, why))

    def _pass_over(
        self,
        name: str,
        backend: BackendConfig,
        snap: BackendSnapshot,
        rng: random.Random,
        features: RequestFeatures,
        measured: Callable[[str], bool] | None,
        batch: float,
        leads: bool = False,
        probing: bool = False,
    ) -> str | None:
        """Why a speculative backend is passed over now (None: kept). ``batch``: the
        requests on its compute before this one (its compute group's batch, or the group's
        recent peak less one: the batch it would run if it took the group's load, as a busy
        group's requests join one backend). Up to ``max_batch_for_speculation`` it is kept.
        When it ``leads`` (holds most of this gateway's requests in flight on its compute
        group: a burst of ours runs there) it keeps the burst up to :data:`LEADER_SLACK`
        times the limit, and past that while ``measured(name)`` (its speed and a plain
        backend's were learnt at this load, so they decide instead of the limit). Otherwise
        it is kept up to :data:`LEADER_SLACK` times the limit when measured, and passed over
        past that whatever was learnt.

        Learnt speeds start a burst on it no further than :data:`LEADER_SLACK` times the
        limit: a load band spans a range of loads (:func:`~gateway.routing.adaptive.load_band`),
        so a band measured at its bottom says little about its top. On the GPU cost twin
        (EAGLE-3's limit 16, docs/benchmarks.md section 7, "Twenty-second run", when bands
        doubled) waves of 32 on
        EAGLE-3 taught the 32-63 band that it ran level with plain or faster, and waves of 48
        then went there as a cohort; requests of the wave's tail whose own bucket had not
        been measured met the limit and went to plain, so the GPU was split, every request of
        the wave counted as shared and taught nothing, and each later wave of 48 went the
        same way at 0.58-0.61x plain, where EAGLE-3 alone ran 0.86-0.98x. A burst already
        running there keeps the rule it had: moving its tail elsewhere would split it.
        ``probing`` (:meth:`_probes`): kept up to :data:`LEADER_SLACK` times the limit though
        not measured there, so its speed at that load is learnt."""
        if name not in self.speculative:
            return None
        refused = features.spec_refused.get(backend.spec.method or "")
        if refused:
            return f"{backend.spec.method} speculation refuses {', '.join(refused)}"
        if features.speculation == SPECULATION_ON:
            return None  # the client's call: speed judgements give way
        limit = backend.max_batch_for_speculation
        if limit is not None and leads:
            if batch > limit * LEADER_SLACK and (measured is None or not measured(name)):
                return (
                    f"batch {batch:g} > max_batch_for_speculation {limit} x{LEADER_SLACK} "
                    "(our burst runs there): speculation loses"
                )
        elif limit is not None and batch > limit:
            learnt = measured is not None and measured(name)
            if learnt and batch > limit * LEADER_SLACK:
                return (
                    f"batch {batch:g} > max_batch_for_speculation {limit} x{LEADER_SLACK} "
                    "(learnt speeds decide only up to there): speculation loses"
                )
            if not learnt and not probing:
                return f"batch {batch:g} > max_batch_for_speculation {limit}: speculation loses"
        if snap.demoted and rng.random() >= self.config.routing.probe_share:
            floor = backend.acceptance_floor(self.config.routing.min_acceptance_rate)
            rate = "unknown" if snap.acceptance_rate is None else f"{snap.acceptance_rate:.2f}"
            return f"demoted: acceptance rate {rate} < min_acceptance_rate {floor}"
        return None

    def _probes(
        self,
        name: str,
        backend: BackendConfig,
        pool: str,
        features: RequestFeatures,
        plan: _Plan,
        batch: float,
        leads: bool,
    ) -> str | None:
        """Why the speculative backend ``name`` is kept past its ``max_batch_for_speculation``
        to measure it there (None: it is not): under an adaptive rule, for the first request
        of a cohort on one compute unit (:mod:`gateway.arrivals`; ``plan.cohort``: those
        following it, every request arriving with it) on an idle compute (nothing running or
        waiting there: ``batch`` is the cohort's own, ``plan.arriving``, not the group's
        recent peak), the cohort putting ``batch`` over the limit and at most
        :data:`LEADER_SLACK` times it; ``name`` in the rule's own pool and no
        ``X-Specgate-Speculation: on`` (one whose method refuses a parameter of the request is
        passed over whatever this says: :meth:`_pass_over`); observed for the
        task at some load (a fresh gateway takes the rules' choice), and never observed nor
        probed for it in this request's bucket at this load (``plan.observed``). Draws no
        random number.

        The configured limit is a guess the adaptive policy is meant to measure past, and
        nothing else sends a wave over it: on the GPU cost twin (EAGLE-3's limit 16) every
        wave of 32 went to plain in six repeats of six, where EAGLE-3 alone ran 1.09x plain
        (docs/benchmarks.md section 7, "Twenty-third run"); in the twenty-second run the same
        config's EAGLE-3 ran 0.92x plain at 32. A probe is the whole cohort's: it follows its
        first request, and the burst it starts keeps its later requests up to twice the
        limit (:meth:`_pass_over`). The gateway marks a probe once the request is routed
        there (:meth:`gateway.routing.adaptive.Learner.mark_probed`), so each (task, bucket,
        load band) is probed once: a wave larger than its cohort saw (one cut short by
        :data:`gateway.arrivals.MAX_FORMING_S`) splits past twice the limit, its requests
        then teach nothing (they shared the GPU), and without the mark every such wave
        would be probed and split again. Probes on later requests of a wave split it
        (section 7b, "Session 27"), hence the cohort's first only.
        """
        limit = backend.max_batch_for_speculation
        if (
            limit is None
            or name not in self.speculative
            or pool != plan.pool
            or leads
            or len(plan.cohort) < plan.arriving.get(name, 0.0)  # all arriving follow it
            or plan.observed is None
            or features.speculation == SPECULATION_ON
            or plan.arriving.get(name, 0.0) < batch  # idle, no recent peak above it
            or not limit < batch <= limit * LEADER_SLACK
        ):
            return None
        if not plan.observed(name, True) or plan.observed(name, False):  # (measured: observed)
            return None
        return "never measured at this load"

    def _speculation_first(
        self, order: list[str], outside: list[str], plan: _Plan
    ) -> tuple[list[str], list[str]]:
        """Step 8, ``on``: the try list with its speculative backends first (each part keeps
        its order), and ``outside`` without them (asked for, not a last resort). Those passed
        over for refusing a parameter of the request stay last."""
        backends = self.config.backends
        spec = [b for b in order if backends[b].spec.speculative and b not in plan.deferred]
        if spec:
            plan.reasons.append(f"speculation on (requested): {', '.join(spec)} first")
        rest = [b for b in order if b not in spec]
        return spec + rest, [b for b in outside if b not in spec]

    def _usable(
        self, name: str, features: RequestFeatures, state: Mapping[str, BackendSnapshot]
    ) -> BackendSnapshot | None:
        """``name``'s snapshot when it serves the model and can take a request now (healthy,
        circuit closed, trusted, under its cap), else None."""
        backend, snap = self.config.backends[name], state.get(name)
        if (
            backend.served_model != features.model
            or snap is None
            or not snap.healthy
            or snap.circuit_open
            or snap.suspect is not None
            or (backend.max_inflight is not None and snap.inflight >= backend.max_inflight)
        ):
            return None
        return snap

    def _plain_backends(
        self,
        features: RequestFeatures,
        state: Mapping[str, BackendSnapshot],
        rng: random.Random,
        plan: _Plan,
        order: list[str],
    ) -> list[str]:
        """Healthy plain backends serving the model, not yet in the try list."""
        found: list[tuple[float, float, str]] = []
        for name in self.config.backends:
            if name in order or name in self.speculative:
                continue
            snap = self._usable(name, features, state)
            if snap is None:
                continue
            found.append((snap.outstanding, rng.random(), name))
            why = f"plain backend preferred, {snap.outstanding:g} outstanding"
            plan.candidates.append(Candidate(name, PLAIN_FALLBACK, True, why))
        return [name for _, _, name in sorted(found)]

    def _last_resort(
        self,
        features: RequestFeatures,
        state: Mapping[str, BackendSnapshot],
        rng: random.Random,
        plan: _Plan,
        failover: bool,
    ) -> list[str]:
        """Every backend outside the rule's pools that serves the model and can take the
        request (step 7): plain first, then least outstanding; ``failover``: the rule's own
        backends come first (the candidates say so)."""
        found: list[tuple[bool, float, float, str]] = []
        considered = plan.seen.union(c.backend for c in plan.candidates)
        for name, backend in self.config.backends.items():
            if name in considered:
                continue
            snap = self._usable(name, features, state)
            if snap is None:
                continue
            if backend.spec.speculative and features.speculation == SPECULATION_OFF:
                plan.candidates.append(Candidate(name, LAST_RESORT, False, OFF_WHY))
                continue
            refused = features.spec_refused.get(backend.spec.method or "")
            if backend.spec.speculative and refused:
                why = f"{backend.spec.method} speculation refuses {', '.join(refused)}"
                plan.candidates.append(Candidate(name, LAST_RESORT, False, why))
                continue
            speculative = backend.spec.speculative
            found.append((speculative, snap.outstanding, rng.random(), name))
            why = f"healthy, {snap.outstanding:g} outstanding"
            if failover:
                why += "; failover target after the rule's backends"
            plan.candidates.append(Candidate(name, LAST_RESORT, True, why))
        return [name for *_, name in sorted(found)]


def _exploration(
    penalties: Mapping[str, float],
    load: LoadView,
    eligible: list[str],
    arriving: Mapping[str, float],
) -> float:
    """How widely a choice explores (``explore`` of :func:`choose`): not at all while a
    candidate's compute group is busy (it joins the busiest); else the inverse square root
    of the requests the choice commits (an idle group's recent peak, or the requests
    ``arriving`` with this one on a candidate's compute, plus this one: a wave follows its
    first request, so exploring costs the whole wave), 1 for a lone request."""
    if penalties:
        return 0.0
    burst = max(
        (max(load.peaks.get(n, 0.0), arriving.get(n, 0.0) + 1) for n in eligible), default=1.0
    )
    return float(max(burst, 1.0) ** -0.5)


def _out_reason(pools: list[str], candidates: Iterable[Candidate]) -> str:
    """Why a rule's pools could not serve: ``pool 'plain' out (plain: unhealthy)``."""
    why = ", ".join(f"{c.backend}: {c.why}" for c in candidates if c.pool in pools and not c.kept)
    names = ", ".join(f"'{p}'" for p in pools)
    label = "pool" if len(pools) == 1 else "pools"
    return f"{label} {names} out ({why or 'no backend'})"


def _keep_together(load: LoadView, plan: _Plan, order: list[str], eligible: list[str]) -> None:
    """Static policy on shared compute: when the first backend would spread load over a busy
    compute group, put first the first eligible one that does not (in place)."""
    if order[0] not in load.spreads:
        return
    together = next((n for n in eligible if n not in load.spreads), None)
    if together is None:
        return
    order.remove(together)
    order.insert(0, together)
    plan.reasons.append(f"shared compute: {together} first, keeping load on its busy compute")
