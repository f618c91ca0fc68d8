"""vLLM-style ``/metrics`` pages for the fakes: load gauges and speculative-decoding counters,
in the exposition format real vLLM servers write (see tests/data/vllm-ngram-metrics-*.txt)."""

from __future__ import annotations

from collections.abc import Sequence

_LABELS = 'engine="0",model_name="smollm2-135m-instruct"'


def vllm_metrics_page(
    *,
    accepted_per_pos: Sequence[float] = (),
    drafts: float | None = None,
    running: float = 0.0,
    waiting: float = 0.0,
    kv_cache_usage: float = 0.0,
) -> str:
    """A page with ``num_requests_running``/``waiting``, ``kv_cache_usage_perc`` and, when
    ``drafts`` is given, the ``spec_decode`` counters: k = ``len(accepted_per_pos)`` draft
    tokens per draft, accepted tokens = the sum over positions."""
    lines = []
    for name, value in (
        ("num_requests_running", running),
        ("num_requests_waiting", waiting),
        ("kv_cache_usage_perc", kv_cache_usage),
    ):
        lines += [f"# TYPE vllm:{name} gauge", f"vllm:{name}{{{_LABELS}}} {float(value)}"]
    if drafts is not None:
        k = len(accepted_per_pos)
        for name, value in (
            ("num_drafts", drafts),
            ("num_draft_tokens", drafts * k),
            ("num_accepted_tokens", sum(accepted_per_pos)),
        ):
            full = f"vllm:spec_decode_{name}_total"
            lines += [f"# TYPE {full} counter", f"{full}{{{_LABELS}}} {float(value)}"]
        full = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
        lines.append(f"# TYPE {full} counter")
        lines += [
            f'{full}{{{_LABELS},position="{i}"}} {float(v)}' for i, v in enumerate(accepted_per_pos)
        ]
    return "\n".join(lines) + "\n"
