"""Scraping vLLM /metrics and windowed acceptance, on pages recorded from a real ngram server."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.acceptance import AcceptanceWindow, SpecCounters, is_demoted
from contracts.vllm_metrics import parse_vllm_metrics

DATA = Path(__file__).resolve().parents[1] / "data"


def test_parse_recorded_ngram_metrics() -> None:
    after = parse_vllm_metrics((DATA / "vllm-ngram-metrics-after.txt").read_text())
    assert after.spec == SpecCounters(
        drafts=18.0,
        draft_tokens=90.0,
        accepted_tokens=59.0,
        accepted_per_pos=(16.0, 11.0, 11.0, 11.0, 10.0),
    )
    assert (after.running, after.waiting, after.kv_cache_usage) == (0.0, 0.0, 0.0)


def test_only_the_families_read_are_parsed() -> None:
    page = (DATA / "vllm-ngram-metrics-after.txt").read_text()
    labels = '{engine="0",model_name="smollm2-135m-instruct"}'
    for name, value in (("num_requests_running", 7), ("num_requests_waiting", 3),
                        ("kv_cache_usage_perc", 0.25)):  # fmt: skip
        page = page.replace(f"vllm:{name}{labels} 0.0", f"vllm:{name}{labels} {value}")
    page += "vllm:e2e_request_latency_seconds_bucket{le= broken\n"  # a family not read
    metrics = parse_vllm_metrics(page)
    assert (metrics.running, metrics.waiting, metrics.kv_cache_usage) == (7.0, 3.0, 0.25)
    assert metrics.spec is not None and metrics.spec.accepted_per_pos == (16, 11, 11, 11, 10)
    with pytest.raises(ValueError):  # a page without vLLM's families is parsed whole
        parse_vllm_metrics("this is { not prometheus\n")


def test_window_over_two_real_scrapes() -> None:
    before = parse_vllm_metrics((DATA / "vllm-ngram-metrics-before.txt").read_text())
    after = parse_vllm_metrics((DATA / "vllm-ngram-metrics-after.txt").read_text())
    assert before.spec is not None and after.spec is not None
    window = AcceptanceWindow(window_s=60)
    window.add(0.0, before.spec)
    window.add(2.0, after.spec)
    stats = window.stats()
    assert stats is not None
    assert stats.rate == pytest.approx(59 / 90)
    assert stats.mean_length == pytest.approx(1 + 59 / 18)
    assert stats.per_position == pytest.approx((16 / 18, 11 / 18, 11 / 18, 11 / 18, 10 / 18))


def test_plain_server_has_no_spec_counters() -> None:
    text = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0"} 3.0\n'
    text += '# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine="0"} 2.0\n'
    metrics = parse_vllm_metrics(text)
    assert metrics.spec is None
    assert (metrics.running, metrics.waiting) == (3.0, 2.0)


def counters(drafts: float, accepted: float, k: int = 5) -> SpecCounters:
    return SpecCounters(drafts=drafts, draft_tokens=drafts * k, accepted_tokens=accepted)


def test_window_slides_collapse_and_recovery() -> None:
    """A backend at 60% that collapses to 2% and recovers: the window follows each phase."""
    window = AcceptanceWindow(window_s=10)
    drafts = accepted = 0.0
    rates = []
    for second in range(0, 60, 2):
        phase_rate = 0.6 if second < 20 or second >= 40 else 0.02
        drafts += 10
        accepted += 10 * 5 * phase_rate
        window.add(float(second), counters(drafts, accepted))
        stats = window.stats()
        rates.append(None if stats is None else round(stats.rate, 3))
    assert rates[0] is None  # one sample: no delta yet
    assert rates[9] == 0.6  # t=18
    assert rates[19] == 0.02  # t=38: the window holds only the collapse
    assert rates[29] == 0.6  # t=58: recovered
    assert all(t >= 58 - 10 - 2 for t, _ in window.samples)


def test_counter_reset_clears_the_window() -> None:
    window = AcceptanceWindow()
    window.add(0, counters(100, 300))
    window.add(2, counters(110, 330))
    window.add(4, counters(5, 1))  # the backend restarted
    assert window.stats() is None
    window.add(6, counters(15, 26))
    stats = window.stats()
    assert stats is not None and stats.rate == pytest.approx(25 / 50)


def test_demotion_needs_enough_drafted_tokens() -> None:
    window = AcceptanceWindow()
    window.add(0, counters(0, 0))
    window.add(2, counters(10, 1))  # 50 draft tokens at 2%
    assert not is_demoted(window.stats(), 0.5, min_draft_tokens=200)
    window.add(4, counters(50, 4))
    assert is_demoted(window.stats(), 0.5, min_draft_tokens=200)
    assert not is_demoted(window.stats(), None, min_draft_tokens=200)  # plain backend
