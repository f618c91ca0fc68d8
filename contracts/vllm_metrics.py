"""Parse a vLLM ``/metrics`` page into the load and speculation figures routing uses."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from contracts.acceptance import SpecCounters

_GAUGES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
}
_SPEC = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
}
_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
#: The start of every sample and ``# TYPE`` line of the families read here
#: (``_PER_POS`` starts as the accepted-tokens family does).
_READ = tuple(f"{p}{name}" for name in (*_GAUGES, *_SPEC) for p in ("", "# TYPE "))


@dataclass(frozen=True, slots=True)
class VllmMetrics:
    """One scrape: requests running and waiting, KV-cache usage (0-1), and the cumulative
    speculation counters (None on a plain server, which exports no ``spec_decode`` series).
    Values are summed over label sets (engines, model names)."""

    running: float = 0.0
    waiting: float = 0.0
    kv_cache_usage: float = 0.0
    spec: SpecCounters | None = None


def parse_vllm_metrics(text: str) -> VllmMetrics:
    """Parse Prometheus text exposition from vLLM with prometheus-client's parser.

    Only the lines of the families read here are parsed: a vLLM page is ~60 kB of
    histograms, which the parser took ~19 ms (up to hundreds under CPU contention) to read
    on the gateway's event loop, four backends every 2 s (docs/benchmarks.md, section 10); a
    page with none of them (not vLLM's) is parsed whole. Counter families are matched by
    name without their ``_total`` suffix (the parser strips it; the ``_created`` samples are
    skipped). Raises ValueError on malformed text (in the lines read).
    """
    read = "\n".join(line for line in text.splitlines() if line.startswith(_READ))
    values: dict[str, float] = defaultdict(float)
    per_pos: dict[int, float] = defaultdict(float)
    for family in text_string_to_metric_families(read or text):
        name = family.name.removesuffix("_total")  # untyped families keep the suffix
        gauge, spec = _GAUGES.get(name), _SPEC.get(name)
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            if gauge:
                values[gauge] += sample.value
            elif spec:
                values[spec] += sample.value
            elif name == _PER_POS:
                per_pos[int(sample.labels.get("position", "0"))] += sample.value
    counters = None
    if "draft_tokens" in values:
        positions = tuple(per_pos[i] for i in range(max(per_pos, default=-1) + 1))
        counters = SpecCounters(
            drafts=values["drafts"],
            draft_tokens=values["draft_tokens"],
            accepted_tokens=values["accepted_tokens"],
            accepted_per_pos=positions,
        )
    return VllmMetrics(
        running=values["running"],
        waiting=values["waiting"],
        kv_cache_usage=values["kv_cache_usage"],
        spec=counters,
    )
