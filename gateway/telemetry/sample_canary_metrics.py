"""Prometheus families of the distribution canary, read at scrape time: per speculative
backend and temperature band (``backend``, ``band`` labels) its verdict, p-value and window
counts; per backend whether it is kept from sampled traffic; the canary's cost over the last
hour (each family's help text says what it counts)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.upstream.sample_canary import SampleCanary


class SampleCanaryCollector(Collector):
    """The families above from one :class:`SampleCanary`."""

    def __init__(self, canary: SampleCanary) -> None:
        self.canary = canary

    def collect(self) -> Iterator[Metric]:
        """One sample per stream with a verdict, per backend, and the cost figures."""
        labels = ("backend", "band")
        failing = GaugeMetricFamily(
            "specgate_sample_canary_failing",
            "1 while the backend's sampled tokens in this temperature band fail the "
            "distribution test, 0 while they pass.",
            labels=labels,
        )
        p_value = GaugeMetricFamily(
            "specgate_sample_canary_p_value",
            "One-sided p-value of the window's tail-token count under the null tail rate.",
            labels=labels,
        )
        tokens = GaugeMetricFamily(
            "specgate_sample_canary_window_tokens",
            "Sampled tokens in the stream's evidence window.",
            labels=labels,
        )
        tail = GaugeMetricFamily(
            "specgate_sample_canary_window_tail_tokens",
            "Sampled tokens in the window whose log-probability under the target is below "
            "the floor.",
            labels=labels,
        )
        for (backend, band), stream in self.canary.streams.items():
            n, k = stream.counts()
            tokens.add_metric([backend, band], n)
            tail.add_metric([backend, band], k)
            if stream.verdict != "pending":
                failing.add_metric([backend, band], 1.0 if stream.verdict == "fail" else 0.0)
            if stream.p_value is not None:
                p_value.add_metric([backend, band], stream.p_value)
        suspect = GaugeMetricFamily(
            "specgate_backend_sample_suspect",
            "1 while the distribution canary keeps requests with temperature > 0 off the backend.",
            labels=("backend",),
        )
        for name, state in self.canary.registry.states.items():
            suspect.add_metric([name], 0.0 if state.sample_suspect is None else 1.0)
        cost = self.canary.cost_last_hour()
        spent = GaugeMetricFamily(
            "specgate_sample_canary_tokens_last_hour",
            "Tokens the distribution canary spent over the last hour (sampled: decoded by "
            "the tested servers; scored: prefilled by the plain twin; live_scored: "
            "prefilled by the plain twin to score live traffic).",
            labels=("kind",),
        )
        spent.add_metric(["sampled"], cost["sampled_tokens"])
        spent.add_metric(["scored"], cost["scored_tokens"])
        if "live_scored_tokens" in cost:  # live scoring is on
            spent.add_metric(["live_scored"], cost["live_scored_tokens"])
        yield from (failing, p_value, tokens, tail, suspect, spent)
        yield GaugeMetricFamily(
            "specgate_sample_canary_seconds_last_hour",
            "Wall-clock seconds the distribution canary's rounds took over the last hour.",
            value=cost["seconds"],
        )
        yield CounterMetricFamily(
            "specgate_sample_canary_rounds",
            "Distribution canary rounds since start.",
            value=self.canary.rounds,
        )
