"""The gateway's long-lived core: config, routing policy, backend state and decision stats.

One :class:`Gateway` is built in ``create_app``'s lifespan and reached by handlers through a
dependency; nothing here is module-level state.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from contracts.config import GatewayConfig
from gateway.classify.classifier import classify_text
from gateway.classify.embedding_stage import ClassifierStages
from gateway.classify.features import RequestFeatures, header_task, read_temperature
from gateway.classify.protocol import (
    RoutedFields,
    kind_of,
    read_fields,
    routing_view,
)
from gateway.classify.text import RequestText, read_request
from gateway.errors import bad_request, guarded, model_not_found, too_busy
from gateway.learning.observer import FeedbackCollector
from gateway.routing import control
from gateway.routing.explain import decision_json
from gateway.routing.guards import apply_guards
from gateway.routing.load import break_even
from gateway.routing.policy import RouteDecision, RoutingPolicy
from gateway.routing.seeds import pin_seeded, seeded
from gateway.speculation.prompt_stats import PromptStats, prompt_stats, stats_of
from gateway.speculation.spec_params import SpecParams
from gateway.trace import RequestTrace
from gateway.upstream.quarantine import fingerprint
from gateway.upstream.state import BackendRegistry, DecisionStats
from gateway.upstream.view import BackendView, backend_views


class _Unread:
    """Marks a prompt not read yet (None means read, and not text)."""


UNREAD = _Unread()


def _served_models(config: GatewayConfig) -> tuple[str, ...]:
    """The distinct model names ``config``'s backends serve, in config order (kept per config
    so the hot path does not rebuild them per request)."""
    return tuple(dict.fromkeys(b.served_model for b in config.backends.values()))


@dataclass(frozen=True, slots=True)
class _Derived:
    """What the hot path reads from a config, computed once per config (not per request)."""

    config: GatewayConfig
    wants_prompt_stats: bool  # prompt statistics feed adaptive routing and learning
    spec_methods: frozenset[str]  # the speculation methods of the configured backends

    @classmethod
    def of(cls, config: GatewayConfig) -> _Derived:
        routing = config.routing
        wants = routing.feedback or routing.policy == "adaptive"
        wants = wants or any(rule.policy == "adaptive" for rule in config.rules)
        methods = {b.spec.method or "" for b in config.backends.values() if b.spec.speculative}
        return cls(config, wants, frozenset(methods))


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
    """A routed request read for routing: its typed ``fields``, routing ``features`` and
    prompt statistics (the step the routed endpoints and ``/routes/explain`` share)."""

    kind: type[RoutedFields]
    fields: RoutedFields
    features: RequestFeatures
    prompt: PromptStats | None


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
        self._models = _served_models(config)
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
        #: Called after each successful :meth:`reload` (e.g. to save the learnt state).
        self.reload_hooks: list[Callable[[], None]] = []

    def reload(self, config: GatewayConfig) -> None:
        """Swap in a validated config atomically (one event-loop step).

        Requests in flight keep the backends they were routed to; kept backends keep their
        live state (health, load, acceptance, circuit); new ones start fresh.
        """
        self.policy = RoutingPolicy(config)
        self._models = _served_models(config)
        self.registry.sync(config.backends)
        self.config = config
        self.reloads += 1
        for hook in self.reload_hooks:
            hook()

    def learn(self, trace: RequestTrace) -> None:
        """Observer: feed a finished request to the adaptive learner (``routing.feedback``)."""
        if self.config.routing.feedback:
            self.feedback.observe(trace)

    def _wants_prompt_stats(self) -> bool:
        """Prompt statistics feed adaptive routing and learning: off when both are."""
        return self.derived().wants_prompt_stats

    def prompt_stats(self, body: Mapping[str, Any]) -> PromptStats | None:
        """Prompt statistics for adaptive routing and learning (None when both are off)."""
        if not self._wants_prompt_stats():
            return None
        return prompt_stats(body, self.config.routing.adaptive.max_prompt_chars)

    def break_even(self) -> dict[str, Any]:
        """Per speculative backend and task, its learnt speed relative to the first plain
        backend per load band and the band where it stopped paying (see
        :func:`gateway.routing.load.break_even`; ``{}`` without a plain backend), with the
        configured ``max_batch_for_speculation`` it falls back to until measured."""
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

    def admission(self, limit: int) -> Admission:
        """A request's :class:`Admission` among at most ``limit`` in flight."""
        return Admission(self, limit)

    def prepare(
        self,
        kind: type[RoutedFields],
        body: Any,
        task_header: str | None,
        fields: RoutedFields | None = None,
        speculation: str | None = None,
        *,
        count: bool = True,
    ) -> Prepared:
        """Read a parsed body of a routed endpoint for routing (its fields, unless already
        read, the routing view's features and prompt statistics); ``speculation``: the
        request's ``X-Specgate-Speculation`` (:meth:`control_of`; ``count``: count a
        refusal). Raises :class:`~gateway.errors.GatewayError` 400/404 as the endpoint
        answers."""
        if fields is None:
            fields = read_fields(kind, body)
        view = routing_view(kind, body, fields)
        features, prompt = self.read(view, fields.model, task_header, body, kind.path)
        if speculation is not None:
            wanted = self.control_of(speculation, count=count)
            features = replace(features, speculation=wanted, speculation_header=speculation)
        return Prepared(kind, fields, features, prompt)

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

    def control(self, decision: RouteDecision, *, count: bool = True) -> RouteDecision:
        """The final ``decision`` (guards applied, seed pinned) with the effect of the
        request's ``X-Specgate-Speculation`` (:func:`gateway.routing.control.outcome`);
        unchanged without the header. Raises :class:`~gateway.errors.GatewayError` 400
        ``speculation_unavailable`` when the request's own parameters make the control
        impossible (:func:`gateway.routing.control.conflict`); ``count``: count the
        result in ``stats.speculation``."""
        features = decision.features
        if features.speculation_header is None:
            return decision
        refused = control.conflict(self.config, decision)
        if refused is not None:
            if count:
                self.stats.speculation[features.speculation, "refused"] += 1
            message, param = refused
            raise bad_request(
                f"{control.HEADER}: {features.speculation} cannot be honoured for this "
                f"request: {message}.",
                param=param,
                code="speculation_unavailable",
            )
        text, result = control.outcome(self.config, decision)
        if count:
            value = features.speculation
            if result == "ignored":  # the value the client sent, as far as it is one
                value = control.read_value(features.speculation_header) or "invalid"
            self.stats.speculation[value, result] += 1
        return replace(decision, speculation=text)

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
        return list(self._models)

    def spec_methods(self) -> set[str]:
        """The speculation methods of the configured backends."""
        return set(self.derived().spec_methods)

    def derived(self) -> _Derived:
        """What the hot path reads from the current config, computed once per config."""
        if self._derived.config is not self.config:
            self._derived = _Derived.of(self.config)
        return self._derived

    def features(
        self,
        body: Mapping[str, Any],
        model: str | None,
        task_header: str | None,
        raw_body: Mapping[str, Any] | None = None,
        endpoint: str = "/v1/chat/completions",
        text: RequestText | None | _Unread = UNREAD,
    ) -> RequestFeatures:
        """Read routing features from a routing view (see :func:`routing_view`); the
        sampling parameters speculation refuses on ``endpoint`` are read from ``raw_body``
        (the client's own body; default ``body``); ``text``: the view's
        :func:`~gateway.classify.text.read_request`, when already read.

        ``model`` None (absent or unreadable) is the first served model, as vLLM serves
        its only model then. Raises :class:`~gateway.errors.GatewayError` 404 when no
        backend serves ``model``.
        """
        if model is None:
            model = self._models[0]
        elif model not in self._models:
            raise model_not_found(model)
        temperature, given = read_temperature(body, self.config.defaults.temperature)
        refused = self.spec_params.refused(
            body if raw_body is None else raw_body, self.spec_methods(), endpoint
        )
        stream = bool(body.get("stream"))
        task = header_task(task_header)
        if task is not None:
            return RequestFeatures(
                model, temperature, given, task, 1.0, "header", stream, spec_refused=refused
            )
        if isinstance(text, _Unread):
            text = read_request(body)
        guess = classify_text(
            text, default_task=self.config.defaults.task, second=self.classifier.second
        )
        return RequestFeatures(
            model,
            temperature,
            given,
            guess.task,
            guess.confidence,
            "classifier" if guess.stage == "fast" else "classifier+embedding",
            stream,
            task_features=guess.features,  # shown by /routes/explain (the dict exists anyway)
            spec_refused=refused,
        )

    def read(
        self,
        body: Mapping[str, Any],
        model: str | None,
        task_header: str | None,
        raw_body: Mapping[str, Any] | None = None,
        endpoint: str = "/v1/chat/completions",
    ) -> tuple[RequestFeatures, PromptStats | None]:
        """Routing features and prompt statistics of a routing view, from one bounded read
        of its prompt (:func:`~gateway.classify.text.read_request`) shared by the classifier
        and the statistics. Arguments and errors as for :meth:`features`."""
        wanted = self._wants_prompt_stats()
        text: RequestText | None | _Unread = UNREAD
        if wanted or header_task(task_header) is None:
            text = read_request(body)
        features = self.features(body, model, task_header, raw_body, endpoint, text)
        if not wanted or isinstance(text, _Unread):
            return features, None
        return features, stats_of(text, self.config.routing.adaptive.max_prompt_chars)

    def explain(
        self,
        body: Any,
        task_header: str | None,
        endpoint: str | None = None,
        speculation: str | None = None,
    ) -> dict[str, Any]:
        """The decision for a body of a routed ``endpoint`` (default: guessed from the body,
        see :func:`~gateway.classify.protocol.kind_of`) against the current state, without calling a
        backend or counting it (see :func:`decision_json` for the shape); ``speculation``:
        the request's ``X-Specgate-Speculation``. Raises
        :class:`~gateway.errors.GatewayError` 400/404 as the real endpoint would.
        """
        kind = kind_of(body, endpoint)
        prepared = self.prepare(kind, body, task_header, None, speculation, count=False)
        decision = self.policy.decide(
            prepared.features,
            self.registry.snapshot(),
            random.Random(0),
            self.feedback.learner.view(),
            prepared.prompt,
        )
        verdict = apply_guards(self.config, decision, body)
        path = endpoint or prepared.kind.path
        pinned = self.pin_seed(verdict.decision, body, path)
        conflict = None
        if prepared.features.speculation_header is not None:
            conflict = control.conflict(self.config, pinned)
            if conflict is None:
                pinned = replace(pinned, speculation=control.outcome(self.config, pinned)[0])
        out = decision_json(pinned)
        if verdict.refused_by is not None and decision.last_resort is not None:
            out["reasons"].append("no last-resort backend is free of known engine bugs: 503")
        elif verdict.refused_by is not None:
            out["backend"], out["backends"] = None, []
            out["reasons"].append(f"refused: 400 engine_bug_guard '{verdict.refused_by}'")
        elif conflict is not None:
            out["backend"], out["backends"] = None, []
            out["reasons"].append(f"refused: 400 speculation_unavailable ({conflict[0]})")
        return out

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
        verdict = apply_guards(self.config, decision, body, prompt_tokens)
        for name in dict.fromkeys(g for _, g in verdict.hits):
            self.stats.guarded[name] += 1
        if decision.last_resort is not None:
            return verdict.decision  # a guard only removes a last resort (none left: 503)
        if verdict.refused_by is not None:
            raise guarded(verdict.refused_by, self.config.guards[verdict.refused_by].why)
        return verdict.decision

    def pin_seed(
        self, decision: RouteDecision, body: Mapping[str, Any], path: str
    ) -> RouteDecision:
        """A seeded request that samples goes to a backend chosen from the request (for
        ``path``) and the config alone, so the same request gets the same tokens again
        (:func:`gateway.routing.seeds.pin_seeded`); other requests are unchanged."""
        if not seeded(body, self.config.defaults.temperature):
            return decision  # most requests: no fingerprint to compute
        return pin_seeded(self.config, decision, body, fingerprint(path, body))

    def decide(self, features: RequestFeatures, prompt: PromptStats | None = None) -> RouteDecision:
        """Route one request against the current backend state and what was learnt (for
        adaptive rules), and count the decision."""
        estimates = self.feedback.learner.view()
        decision = self.policy.decide(
            features, self.registry.snapshot(), self.rng, estimates, prompt
        )
        self.stats.by_rule[decision.rule] += 1
        self.stats.by_task[features.task] += 1
        if features.spec_refused:
            self.spec_params.passed_over.update(set().union(*features.spec_refused.values()))
        return decision
