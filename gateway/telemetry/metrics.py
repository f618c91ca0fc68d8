"""The gateway's own Prometheus metrics (``specgate_*``), in a registry built per app.

Two sources:

* :meth:`GatewayMetrics.observe` is a request-trace observer (see :mod:`gateway.trace`): it
  counts requests and completion tokens and fills the latency histograms;
* :class:`BackendCollector` reads the live backend state at scrape time (``gateway.config``
  and ``gateway.registry.states``), so a reloaded config or a new backend needs no
  re-registration.

Histogram buckets, in seconds, chosen for LLM serving (vLLM's own histograms use similar
ranges): time to first token 10 ms (cached prompt on a GPU) to 120 s (long prompt queued on a
CPU); inter-chunk gaps 1 ms (several speculative chunks back to back) to 2.5 s (a stalled
batch), dense around 10-100 ms where one decoding step lands on GPU and CPU; end to end
100 ms to about 10 min (long generations are legitimate, there is no total cap).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.service import Gateway
from gateway.speculation.advisor import advise_window
from gateway.trace import RequestTrace
from gateway.upstream.state import HEALTH_STATES

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 120)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1, 2.5)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)

#: Label value for a request that never reached a backend (or a rule, or a task).
NONE = "none"


class _Timing(NamedTuple):
    """The labelled children of one (backend, task)."""

    duration: Any
    ttft: Any
    itl: Any
    tokens: Any


class GatewayMetrics:
    """The app's metrics: a private :class:`CollectorRegistry` with the request metrics
    (filled by :meth:`observe`) and a :class:`BackendCollector` over ``gateway``."""

    def __init__(self, gateway: Gateway) -> None:
        self.registry = CollectorRegistry()
        labels = ("backend", "rule", "task", "status")
        self.requests = Counter(
            "specgate_requests",
            "Requests finished, by serving backend, rule, task and HTTP status "
            "(499: the client went away).",
            labels,
            registry=self.registry,
        )
        timing = ("backend", "task")
        self.ttft = Histogram(
            "specgate_time_to_first_token_seconds",
            "Time from request arrival to the first byte relayed to the client.",
            timing,
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.itl = Histogram(
            "specgate_inter_token_latency_seconds",
            "Gaps between relayed chunks of a response (one chunk may carry several tokens).",
            timing,
            buckets=ITL_BUCKETS,
            registry=self.registry,
        )
        self.duration = Histogram(
            "specgate_request_duration_seconds",
            "End-to-end request duration, arrival to last byte.",
            timing,
            buckets=E2E_BUCKETS,
            registry=self.registry,
        )
        self.tokens = Counter(
            "specgate_completion_tokens",
            "Completion tokens from the responses' usage (responses without usage not counted).",
            timing,
            registry=self.registry,
        )
        self.registry.register(BackendCollector(gateway))
        self._requests: dict[tuple[str, str, str, str], Any] = {}
        self._timing: dict[tuple[str, str], _Timing] = {}

    def observe(self, trace: RequestTrace) -> None:
        """Request-trace observer: count one finished request and record its timings.

        The labelled children are looked up once per label set and kept (prometheus-client's
        ``labels()`` validates and locks on every call)."""
        backend, task = trace.backend or NONE, trace.task or NONE
        status = str(trace.status) if trace.status is not None else NONE
        key = (backend, trace.rule or NONE, task, status)
        counter = self._requests.get(key)
        if counter is None:
            counter = self._requests[key] = self.requests.labels(*key)
        counter.inc()
        timing = self._timing.get((backend, task))
        if timing is None:
            timing = self._timing[(backend, task)] = _Timing(
                self.duration.labels(backend, task),
                self.ttft.labels(backend, task),
                self.itl.labels(backend, task),
                self.tokens.labels(backend, task),
            )
        if trace.duration_s is not None:
            timing.duration.observe(trace.duration_s)
        if trace.ttft_s is not None:
            timing.ttft.observe(trace.ttft_s)
        for gap in trace.gaps_s:
            timing.itl.observe(gap)
        tokens = trace.completion_tokens()
        if tokens is not None:
            timing.tokens.inc(tokens)


class BackendCollector(Collector):
    """Per-backend gauges computed at scrape time from the live state and the config."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def collect(self) -> Iterator[Metric]:
        """One family per figure, one sample per configured backend (acceptance figures only
        for speculative backends with a measured window)."""
        gateway = self.gateway

        def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"specgate_backend_{name}", doc, labels=("backend", *extra))

        info = gauge("info", "Backend identity (always 1).", ("method", "url", "model"))
        healthy = gauge(
            "healthy",
            "1 while health lets routing send it traffic (last /health probe passed, or not"
            " probed yet), 0 when down.",
        )
        health = gauge("health", "1 for the backend's health: up, down or unknown.", ("state",))
        circuit = gauge("circuit_open", "1 while the circuit breaker keeps the backend out.")
        inflight = gauge("inflight", "Requests this gateway has in flight to the backend.")
        running = gauge("running", "vLLM requests running (last scrape).")
        waiting = gauge("waiting", "vLLM requests waiting (last scrape).")
        kv = gauge("kv_cache_usage", "vLLM KV-cache usage, 0-1 (last scrape).")
        demoted = gauge("demoted", "1 while acceptance is under the backend's floor.")
        rate = gauge("acceptance_rate", "Accepted / drafted tokens over the acceptance window.")
        length = gauge("mean_acceptance_length", "Tokens per verification step (window).")
        per_pos = gauge(
            "acceptance_per_position", "Share of drafts accepted at a position.", ("position",)
        )
        k_now = gauge("speculative_tokens", "Configured num_speculative_tokens.")
        k_rec = gauge("recommended_speculative_tokens", "The tuning advisor's k.")
        demotions = CounterMetricFamily(
            "specgate_backend_demotions", "Times demoted since start.", labels=("backend",)
        )
        for view in gateway.backends():
            name, backend = view.name, view.config
            spec = backend.spec
            info.add_metric([name, spec.method, backend.base_url, backend.served_model], 1)
            healthy.add_metric([name], 1.0 if view.available else 0.0)
            for state in HEALTH_STATES:
                health.add_metric([name, state], 1.0 if view.health == state else 0.0)
            circuit.add_metric([name], 1.0 if view.circuit_open else 0.0)
            inflight.add_metric([name], view.inflight)
            running.add_metric([name], view.running)
            waiting.add_metric([name], view.waiting)
            kv.add_metric([name], view.kv_cache_usage)
            demoted.add_metric([name], 1.0 if view.demoted else 0.0)
            demotions.add_metric([name], view.demotions)
            if not spec.speculative:
                continue
            k_now.add_metric([name], spec.num_speculative_tokens or 0)
            advice = advise_window(spec, view.window)
            if advice is not None:
                k_rec.add_metric([name], advice.recommended_k)
            if view.acceptance is not None:
                rate.add_metric([name], view.acceptance.rate)
                length.add_metric([name], view.acceptance.mean_length)
                for i, value in enumerate(view.acceptance.per_position):
                    per_pos.add_metric([name, str(i)], value)
        yield from (info, healthy, health, circuit, inflight, running, waiting, kv, demoted)
        yield from (rate, length, per_pos, k_now, k_rec, demotions)
        yield from _decision_families(gateway)


def _decision_families(gateway: Gateway) -> Iterator[Metric]:
    stats = gateway.stats
    yield CounterMetricFamily(
        "specgate_failovers", "Attempts moved to the next backend.", value=stats.failovers
    )
    yield CounterMetricFamily(
        "specgate_rejected", "Requests refused with no backend to serve.", value=stats.rejected
    )
    yield CounterMetricFamily(
        "specgate_last_resort",
        "Answers from a backend outside their rule's pools (those out or failing).",
        value=stats.last_resort,
    )
    guarded = CounterMetricFamily(
        "specgate_guarded",
        "Requests that matched a known engine bug guard (avoided or refused).",
        labels=("guard",),
    )
    for name, count in stats.guarded.items():
        guarded.add_metric([name], count)
    yield guarded
    control = CounterMetricFamily(
        "specgate_speculation_control",
        "Requests carrying X-Specgate-Speculation, by value (auto, on, off; invalid) and "
        "result (honoured; plain: on served by a plain backend, no speculative one could "
        "take it; refused: 400; denied, ignored: routing.speculation_control).",
        labels=("value", "result"),
    )
    for (value, result), count in stats.speculation.items():
        control.add_metric([value, result], count)
    yield control
