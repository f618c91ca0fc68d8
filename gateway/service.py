"""The gateway's long-lived core: config, routing policy, backend state and decision stats.

One :class:`Gateway` is built in ``create_app``'s lifespan and reached by handlers through a
dependency; nothing here is module-level state.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from contracts.config import GatewayConfig
from gateway.arrivals import Arrivals
from gateway.classify.classifier import classify_text
from gateway.classify.embedding_stage import ClassifierStages
from gateway.classify.features import RequestFeatures, header_task, read_temperature
from gateway.classify.protocol import (
    Fields,
    ResponsesFields,
    RoutedFields,
    kind_of,
    read_fields,
    routing_view,
)
from gateway.classify.text import RequestText, read_request
from gateway.errors import GatewayError, bad_request, guarded, model_not_found, too_busy
from gateway.learning.observer import FeedbackCollector
from gateway.routing import control
from gateway.routing.explain import decision_json
from gateway.routing.guards import apply_guards
from gateway.routing.load import break_even
from gateway.routing.policy import CohortMember, RouteDecision, RoutingPolicy
from gateway.routing.seeds import pin_seeded, seeded
from gateway.speculation.prompt_stats import PromptStats, stats_of
from gateway.speculation.spec_params import SpecParams
from gateway.trace import ComputeMark, RequestTrace
from gateway.upstream.affinity import ResponseAffinity
from gateway.upstream.quarantine import fingerprint
from gateway.upstream.state import BackendRegistry, DecisionStats
from gateway.upstream.view import BackendView, backend_views


@dataclass(frozen=True, slots=True)
class _Derived:
    """What the hot path reads from a config, computed once per config (not per request)."""

    config: GatewayConfig
    wants_prompt_stats: bool  # prompt statistics feed adaptive routing and learning
    spec_methods: frozenset[str]  # the speculation methods of the configured backends
    models: tuple[str, ...]  # the distinct served model names, in config order

    @classmethod
    def of(cls, config: GatewayConfig) -> _Derived:
        routing = config.routing
        wants = routing.feedback or routing.policy == "adaptive"
        wants = wants or any(rule.policy == "adaptive" for rule in config.rules)
        methods = {b.spec.method or "" for b in config.backends.values() if b.spec.speculative}
        models = tuple(dict.fromkeys(b.served_model for b in config.backends.values()))
        return cls(config, wants, frozenset(methods), models)


class Admission:
    """One request's slot among the gateway's in-flight requests (at most ``limit``): a
    context manager taking the slot on entry (429 ``too_busy`` when none is free) and giving
    it back on exit, whatever happens in between. :meth:`check` refuses early without
    taking one (before the body is read)."""

    __slots__ = ("gateway", "limit")

    def __init__(self, gateway: Gateway, limit: int) -> None:
        self.gateway, self.limit = gateway, limit

    def check(self) -> None:
        """Raise the 429 when no slot is free now."""
        if self.gateway.inflight >= self.limit:
            raise too_busy(f"The gateway has {self.limit} requests in flight.")

    def __enter__(self) -> None:
        self.check()
        self.gateway.inflight += 1

    def __exit__(self, *_: object) -> None:
        self.gateway.inflight -= 1


@dataclass(frozen=True, slots=True)
class Prepared:
    """A routed request read for routing: its parsed ``body``, typed ``fields``, routing
    ``features`` and prompt statistics (the step the routed endpoints and
    ``/routes/explain`` share); ``dry``: explain's, counting nothing."""

    kind: type[RoutedFields]
    body: Any
    fields: Fields
    features: RequestFeatures
    prompt: PromptStats | None
    dry: bool = False


@dataclass(frozen=True, slots=True)
class Routed:
    """A decision after the guards, seed pinning, Responses affinity and the speculation
    control (:meth:`Gateway.route`); ``error``: what the endpoint answers instead of routing
    it (None: routed), ``why``: the line ``/routes/explain`` adds for it."""

    decision: RouteDecision
    error: GatewayError | None = None
    why: str | None = None


def pin(decision: RouteDecision, backend: str | None, why: str) -> RouteDecision:
    """``decision`` sent to ``backend`` only (no failover: the state is there), or
    unchanged when ``backend`` is None or no longer configured."""
    if backend is None or backend not in {c.backend for c in decision.candidates} | set(
        decision.backends
    ):
        return decision
    return replace(decision, backends=(backend,), reasons=(*decision.reasons, f"{backend}: {why}"))


def held_by(affinity: ResponseAffinity | None, kind: type[RoutedFields], body: Any) -> str | None:
    """The backend holding a Responses request's ``previous_response_id`` (None for other
    requests, or when not known)."""
    if affinity is None or kind is not ResponsesFields:
        return None
    previous = body.get("previous_response_id")
    return affinity.backend_of(previous) if isinstance(previous, str) else None


class Gateway:
    """Routes requests for one config and keeps the live state the admin API shows.

    ``rng`` breaks routing ties; pass a seeded ``random.Random`` for reproducible decisions.
    ``feedback`` holds what adaptive routing learnt from finished requests (kept across
    config reloads).
    """

    def __init__(
        self,
        config: GatewayConfig,
        rng: random.Random | None = None,
        registry: BackendRegistry | None = None,
        classifier: ClassifierStages | None = None,
    ) -> None:
        self.config = config
        #: The task classifier's stages (fast only unless the runtime loaded the second).
        self.classifier = classifier or ClassifierStages(None, "off: not loaded")
        self.policy = RoutingPolicy(config)
        self._derived = _Derived.of(config)  # rebuilt when config is swapped
        self.registry = registry or BackendRegistry(config.backends)
        self.inflight = 0
        self.reloads = 0
        self.stats = DecisionStats()
        self.rng = rng or random.Random()
        self.started_at = time.time()
        self.feedback = FeedbackCollector(lambda: self.config.routing.adaptive)
        self.observers: list[Callable[[RequestTrace], None]] = [self.learn]
        self.spec_params = SpecParams()
        #: Requests arriving together, routed as their burst (:mod:`gateway.arrivals`).
        self.arrivals: Arrivals[CohortMember] = Arrivals()
        #: Called after each successful :meth:`reload` (e.g. to save the learnt state).
        self.reload_hooks: list[Callable[[], None]] = []

    def reload(self, config: GatewayConfig) -> None:
        """Swap in a validated config atomically (one event-loop step).

        Requests in flight keep the backends they were routed to; kept backends keep their
        live state (health, load, acceptance, circuit); new ones start fresh.
        """
        self.policy = RoutingPolicy(config)
        self.registry.sync(config.backends)
        self.config = config
        self.reloads += 1
        for hook in self.reload_hooks:
            hook()

    def learn(self, trace: RequestTrace) -> None:
        """Observer: feed a finished request to the adaptive learner (``routing.feedback``).

        A request that shared its GPU with another server of ours (``trace.shared``, set at
        dispatch; or such a server busy as it ends, or one of its requests ended meanwhile:
        ``trace.mark``) is not learnt: servers of one compute
        group time-slice it, so a lone request beside a busy server runs at up to half the
        GPU while the batch beside it slows (on the twin, one EAGLE-3 request of a wave of
        64 ran at 188 tokens/s against plain's 113; learnt, EAGLE-3 looked 1.38x plain at
        32-63 requests for code, where alone it is 0.74x: docs/benchmarks.md section 7,
        session 14).

        Its load band (``trace.concurrency``, the dispatch's, which counts the group's
        recent peak) is lowered, never raised, to what ran beside it as far as this gateway
        can tell: the requests on the group at dispatch (``trace.mark``, without the peak)
        and this gateway's generations begun there since (other clients' that began since
        are not seen). A request sent alone within a burst's memory is then learnt at its own
        load, not the burst's. On the twin, a lone code request 19 s after waves of 48,
        pinned to EAGLE-3 by its seed, was learnt at 32-63 requests at 335 tokens/s, where a
        wave of 32 ran EAGLE-3 at 151; with EAGLE-3's limit at 16, the learnt speeds there
        (``break_even``: code 1.21x plain) replaced the limit and the c=32 and c=64 waves
        went to EAGLE-3 at 0.66 and 0.60x plain (docs/benchmarks.md section 7, "Sixteenth
        run")."""
        if not self.config.routing.feedback:
            return
        if (mark := trace.mark) is not None and mark.backend == trace.backend:  # not failed over
            taken, peer_ends = self._counts(mark.backend)
            # those there at dispatch and ours begun there since, its own among them (a
            # reload that replaced a member's state restarts its counts: at least its own)
            ran = mark.joined + max(taken - mark.taken, 1) - 1
            trace.concurrency = min(trace.concurrency, ran)
            trace.shared = trace.shared or peer_ends != mark.peer_ends
        if trace.backend is not None and not trace.shared:
            trace.shared = self.shares_compute(trace.backend)
        self.feedback.observe(trace)

    def probed(self, decision: RouteDecision) -> None:
        """Mark ``decision``'s probe (:attr:`~gateway.routing.policy.RouteDecision.probe`)
        in what was learnt when the request is routed there, its final decision leading with
        the probed backend (a guard or a pin may have moved it), so that bucket is not
        probed again (:meth:`gateway.routing.adaptive.Learner.mark_probed`)."""
        probe = decision.probe
        if probe is not None and decision.backend == probe[0]:
            self.feedback.learner.mark_probed(decision.features.task, probe[1], probe[0])

    def shares_compute(self, name: str) -> bool:
        """Whether another server of ``name``'s compute group holds requests of this
        gateway now (in flight or routed there and not yet sent); False without a group."""
        peers = self.policy.peers.get(name)
        if not peers:
            return False
        states, now = self.registry.states, self.registry.clock()
        return any((s := states.get(peer)) is not None and s.load(now) > 0 for peer in peers)

    def compute_mark(self, name: str) -> ComputeMark:
        """``name``'s compute group as a request dispatched there now sees it
        (:class:`~gateway.trace.ComputeMark`): ``joined`` is the request itself plus each
        member's requests in flight, this gateway's and other clients' as ``/metrics`` last
        showed them (aged: :meth:`~gateway.upstream.state.BackendState.foreign_load`),
        without the group's remembered peak; this gateway's decisions not yet sent there are
        left out (counted in ``taken`` when they begin)."""
        states, now = self.registry.states, self.registry.clock()
        joined = 1 + sum(
            s.inflight + round(s.foreign_load(now))
            for n in (name, *self.policy.peers.get(name, ()))
            if (s := states.get(n)) is not None
        )
        return ComputeMark(name, joined, *self._counts(name))

    def _counts(self, name: str) -> tuple[int, int]:
        """This gateway's requests begun on ``name``'s compute group (``name`` itself, alone
        without a group, included) and those ended on its other servers, so far."""
        states, peers = self.registry.states, self.policy.peers.get(name, ())
        taken = sum(s.taken for n in (name, *peers) if (s := states.get(n)) is not None)
        ended = sum(s.ended for n in peers if (s := states.get(n)) is not None)
        return taken, ended

    def break_even(self) -> dict[str, Any]:
        """Per speculative backend and task, its learnt speed relative to the first plain
        backend per load band and the band where it stopped paying (see
        :func:`gateway.routing.load.break_even`; ``{}`` without a plain backend), with the
        configured ``max_batch_for_speculation`` it falls back to until measured (learnt
        speeds start a burst there at most twice past it)."""
        if not self.policy.plain:
            return {}
        settings = self.config.routing.adaptive
        spec = {n: b for n, b in self.config.backends.items() if b.spec.speculative}
        learnt = break_even(
            self.feedback.learner.view(),
            spec,
            self.policy.plain[0],
            min_weight=settings.min_load_weight,
            decay=settings.decay,
        )
        return {
            name: {
                "against": self.policy.plain[0],
                "max_batch_for_speculation": backend.max_batch_for_speculation,
                "tasks": learnt.get(name, {}),
            }
            for name, backend in spec.items()
        }

    def quiet(self, model: str) -> bool:
        """True after a quiet spell: none of this gateway's requests of ``model`` is in flight
        or reserved on a backend, and some compute unit serving it (up) held no burst over
        the last 10-20 s (:data:`~gateway.upstream.state.PEAK_WINDOW_S`) past what a cohort
        can tell (where every unit's recent peak does, it already routes the next burst as
        large). A burst arriving now forms a cohort (:mod:`gateway.arrivals`)."""
        states = self.registry.states
        serving = [states[n] for n in self.policy.serving.get(model, ()) if n in states]
        if any(s.inflight for s in serving):  # the common case under load: no clock read
            return False
        now = self.registry.clock()
        if any(s.reserved and s.load(now) for s in serving):
            return False
        # the quietest compute unit that can take a request: a burst on one unit must not
        # keep the others' next burst from forming (its first request would meet them idle)
        unit_of, peaks = self.policy.unit_of, dict[str, int]()
        for name in self.policy.serving.get(model, ()):
            state = states.get(name)
            if state is not None and state.available:
                unit = unit_of[name]
                peaks[unit] = max(peaks.get(unit, 0), state.recent_peak(now))
        peak = min(peaks.values(), default=0)
        return peak - 1 < self.policy.unit_caps.get(model, 0.0)

    def admission(self, limit: int) -> Admission:
        """A request's :class:`Admission` among at most ``limit`` in flight."""
        return Admission(self, limit)

    def prepare(
        self,
        kind: type[RoutedFields],
        body: Any,
        headers: Mapping[str, str],
        fields: Fields | None = None,
        *,
        dry: bool = False,
    ) -> Prepared:
        """Read a parsed body of a routed endpoint for routing: its fields (unless already
        read), the routing view's features (the task from ``headers``' ``x-task-type``, else
        the classifier; the speculation control from its ``X-Specgate-Speculation``,
        :meth:`control_of`, counted unless ``dry``) and prompt statistics, from one bounded
        read of the prompt (:func:`~gateway.classify.text.read_request`). A model None
        (absent or unreadable) is the first served model, as vLLM serves its only model
        then. Raises :class:`~gateway.errors.GatewayError` 400/404 as the endpoint answers."""
        if fields is None:
            fields = read_fields(kind, body)
        view = routing_view(kind, body, fields)
        model, derived = fields.model, self.derived()
        if model is None:
            model = derived.models[0]
        elif model not in derived.models:
            raise model_not_found(model)
        wanted = derived.wants_prompt_stats
        task = header_task(headers.get("x-task-type"))
        text = read_request(view) if wanted or task is None else None
        temperature, given = read_temperature(view, self.config.defaults.temperature)
        task, confidence, source, deciding = self._task(task, text)
        features = RequestFeatures(
            model,
            temperature,
            given,
            task,
            confidence,
            source,
            bool(view.get("stream")),
            task_features=deciding,  # shown by /routes/explain (the dict exists anyway)
            spec_refused=self.spec_params.refused(body, derived.spec_methods, kind.path),
        )
        speculation = headers.get(control.HEADER)
        if speculation is not None:
            wanted_control = self.control_of(speculation, count=not dry)
            features = replace(features, speculation=wanted_control, speculation_header=speculation)
        limit = self.config.routing.adaptive.max_prompt_chars
        prompt = stats_of(text, limit) if wanted else None
        return Prepared(kind, body, fields, features, prompt, dry)

    def control_of(self, value: str, *, count: bool = True) -> str:
        """The speculation control an ``X-Specgate-Speculation`` ``value`` asks for, under
        the config's ``routing.speculation_control`` (``ignore``: always ``auto``). Raises
        :class:`~gateway.errors.GatewayError` 400 ``invalid_speculation_control`` for an
        unknown value and ``speculation_control_denied`` for ``on``/``off`` under ``deny``
        (``count``: count it in ``stats.speculation``)."""
        mode = self.config.routing.speculation_control
        if mode == "ignore":
            return control.AUTO
        wanted = control.read_value(value)
        if wanted is None:
            if count:
                self.stats.speculation["invalid", "refused"] += 1
            raise bad_request(
                f"{control.HEADER} must be one of {', '.join(control.VALUES)}, not {value[:40]!r}.",
                param=control.HEADER,
                code="invalid_speculation_control",
            )
        if mode == "deny" and wanted != control.AUTO:
            if count:
                self.stats.speculation[wanted, "denied"] += 1
            raise bad_request(
                f"This gateway does not take {control.HEADER}: {wanted} "
                "(routing.speculation_control is deny); send auto or no header.",
                param=control.HEADER,
                code="speculation_control_denied",
            )
        return wanted

    def new_trace(self, request_id: str, path: str) -> RequestTrace:
        """A :class:`RequestTrace` for one request, wired to the registered observers."""
        endpoint = path.removeprefix("/v1/")
        return RequestTrace(request_id, endpoint, stream=False, observers=self.observers)

    def backends(self) -> list[BackendView]:
        """Every configured backend's read model now (config order): what ``/routes``,
        ``/status``, ``/metrics`` and ``/ready`` show."""
        return backend_views(self.config.backends, self.registry, self.stats)

    def served_models(self) -> list[str]:
        """The distinct model names the backends serve, in config order."""
        return list(self.derived().models)

    def derived(self) -> _Derived:
        """What the hot path reads from the current config, computed once per config."""
        if self._derived.config is not self.config:
            self._derived = _Derived.of(self.config)
        return self._derived

    def _task(
        self, task: str | None, text: RequestText | None
    ) -> tuple[str, float, str, Mapping[str, float]]:
        """The request's task, confidence, source and the classifier's deciding features:
        the ``X-Task-Type`` header's ``task`` when it names one, else the classifier's guess
        from the prompt's ``text``."""
        if task is not None:
            return task, 1.0, "header", {}
        config, second = self.config, self.classifier.second
        guess = classify_text(text, default_task=config.defaults.task, second=second)
        source = "classifier" if guess.stage == "fast" else "classifier+embedding"
        return guess.task, guess.confidence, source, guess.features

    def explain(
        self,
        body: Any,
        headers: Mapping[str, str],
        endpoint: str | None = None,
        affinity: ResponseAffinity | None = None,
    ) -> dict[str, Any]:
        """The decision for a body of a routed ``endpoint`` (default: guessed from the body,
        see :func:`~gateway.classify.protocol.kind_of`) against the current state, through
        the routed request's own steps (:meth:`prepare`, :meth:`decide`, :meth:`route`) but
        without calling a backend (the guards use the prompt's length bound) or counting it
        (see :func:`decision_json` for the shape; a refusal clears ``backend`` and says why
        in ``reasons``); ``headers``: the request's (lower-case names), ``affinity``: where
        stored Responses are held. Raises :class:`~gateway.errors.GatewayError` 400/404 as
        the real endpoint would."""
        kind = kind_of(body, endpoint)
        prepared = self.prepare(kind, body, headers, dry=True)
        decision = self.decide(prepared.features, prepared.prompt, dry=True)
        held = held_by(affinity, kind, body)
        routed = self.route(decision, prepared, endpoint or kind.path, held=held)
        out = decision_json(routed.decision)
        if routed.why is not None:
            out["reasons"].append(routed.why)
        if routed.error is not None:
            out["backend"], out["backends"] = None, []
        return out

    def route(
        self,
        decision: RouteDecision,
        prepared: Prepared,
        path: str,
        *,
        tokens: int | None = None,
        held: str | None = None,
    ) -> Routed:
        """The steps after the policy's ``decision`` for ``prepared`` (sent to ``path``),
        shared by routed requests and ``/routes/explain``: the known-engine-bug guards
        (``tokens``: the exact prompt length when known), seed pinning
        (:func:`~gateway.routing.seeds.pin_seeded`), the Responses conversation's backend
        (``held``, see :func:`held_by`) and the client's speculation control; counted unless
        ``prepared.dry``. A refusal is returned, not raised: 400 ``engine_bug_guard`` or
        ``speculation_unavailable``."""
        body, note = prepared.body, None
        if self.config.guards:
            guarded_by = self._guarded(decision, body, tokens, count=not prepared.dry)
            if guarded_by.error is not None:
                return guarded_by
            decision, note = guarded_by.decision, guarded_by.why
        if seeded(body, self.config.defaults.temperature):  # same request, same tokens
            decision = pin_seeded(self.config, decision, body, fingerprint(path, body))
        bug = dict(decision.guarded).get(held or "")
        if bug is not None:  # the conversation lives where this request hits a known bug
            return self._refused_by(bug, decision)
        routed = self._control(pin(decision, held, "holds previous_response_id"), prepared.dry)
        return routed if note is None or routed.error is not None else replace(routed, why=note)

    def guard(
        self,
        decision: RouteDecision,
        body: Mapping[str, Any],
        prompt_tokens: int | None = None,
    ) -> RouteDecision:
        """Apply the candidate backends' known-engine-bug guards (config ``guards``) to a
        decision (``prompt_tokens``: the exact prompt length when known, else its upper
        bound is used); counts each guard hit. Raises :class:`~gateway.errors.GatewayError` 400
        ``engine_bug_guard`` when a guard refuses the request or leaves no backend, except on
        a last-resort decision: there a guard only removes its backends (the rule's own pools
        are out, so an empty list is the caller's 503)."""
        if not self.config.guards:
            return decision
        routed = self._guarded(decision, body, prompt_tokens, count=True)
        if routed.error is not None:
            raise routed.error
        return routed.decision

    def _guarded(
        self, decision: RouteDecision, body: Mapping[str, Any], tokens: int | None, *, count: bool
    ) -> Routed:
        """:meth:`guard`'s verdict, a refusal returned (``count``: count the hits)."""
        verdict = apply_guards(self.config, decision, body, tokens)
        if count:
            for name in dict.fromkeys(g for _, g in verdict.hits):
                self.stats.guarded[name] += 1
        if verdict.refused_by is None:
            return Routed(verdict.decision)
        if decision.last_resort is not None:  # a guard only removes a last resort (none: 503)
            why = "no last-resort backend is free of known engine bugs: 503"
            return Routed(verdict.decision, why=why)
        return self._refused_by(verdict.refused_by, verdict.decision)

    def _refused_by(self, guard: str, decision: RouteDecision) -> Routed:
        """The 400 ``engine_bug_guard`` of ``guard`` for ``decision``."""
        error = guarded(guard, self.config.guards[guard].why)
        return Routed(decision, error, f"refused: 400 engine_bug_guard '{guard}'")

    def _control(self, decision: RouteDecision, dry: bool) -> Routed:
        """The final ``decision`` with the effect of the request's ``X-Specgate-Speculation``
        (:func:`gateway.routing.control.outcome`; unchanged without the header), counted in
        ``stats.speculation`` unless ``dry``; the 400 ``speculation_unavailable`` when the
        request's own parameters make the control impossible
        (:func:`gateway.routing.control.conflict`)."""
        features = decision.features
        if features.speculation_header is None:
            return Routed(decision)
        refused = control.conflict(self.config, decision)
        if refused is not None:
            if not dry:
                self.stats.speculation[features.speculation, "refused"] += 1
            message, param = refused
            error = bad_request(
                f"{control.HEADER}: {features.speculation} cannot be honoured for this "
                f"request: {message}.",
                param=param,
                code="speculation_unavailable",
            )
            return Routed(decision, error, f"refused: 400 speculation_unavailable ({message})")
        text, result = control.outcome(self.config, decision)
        if not dry:
            value = features.speculation
            if result == "ignored":  # the value the client sent, as far as it is one
                value = control.read_value(features.speculation_header) or "invalid"
            self.stats.speculation[value, result] += 1
        return Routed(replace(decision, speculation=text))

    def decide(
        self,
        features: RequestFeatures,
        prompt: PromptStats | None = None,
        *,
        dry: bool = False,
        arriving: int = 0,
        cohort: Sequence[CohortMember] = (),
    ) -> RouteDecision:
        """Route one request against the current backend state and what was learnt (for
        adaptive rules), and count the decision; ``dry`` (explain): ties broken by a fixed
        seed, nothing counted; ``arriving``: other requests of the model not routed yet
        (:mod:`gateway.arrivals`, counted as load); ``cohort``: those of them waiting for
        this one's choice (see :meth:`~gateway.routing.policy.RoutingPolicy.decide`)."""
        estimates, rng = self.feedback.learner.view(), random.Random(0) if dry else self.rng
        state = self.registry.snapshot()
        decision = self.policy.decide(features, state, rng, estimates, prompt, arriving, cohort)
        if dry:
            return decision
        self.stats.by_rule[decision.rule] += 1
        self.stats.by_task[features.task] += 1
        if features.spec_refused:
            self.spec_params.passed_over.update(set().union(*features.spec_refused.values()))
        return decision
