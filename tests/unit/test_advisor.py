"""The tuning advisor on measured acceptance: the H200 ngram figures, the recorded CPU
pages, windows over counter series, and the bad and perfect drafts of the local stack."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.acceptance import AcceptanceStats, AcceptanceWindow, SpecCounters
from contracts.launch_profile import Speculation
from contracts.vllm_metrics import parse_vllm_metrics
from gateway.speculation.advisor import (
    Knobs,
    advise,
    advise_window,
    config_json,
    expected_tokens,
    fit_alpha,
)

DATA = Path(__file__).resolve().parents[1] / "data"
NGRAM = Speculation(
    method="ngram", num_speculative_tokens=5, prompt_lookup_min=2, prompt_lookup_max=4
)
DRAFT = Speculation(method="draft_model", model="draft-8l", num_speculative_tokens=3)
#: /work/shared/notes/gpu-h200.md: vLLM 0.26 on an H200, ngram k=5.
H200 = AcceptanceStats(
    rate=0.529,
    mean_length=3.64,
    drafts=1000,
    draft_tokens=5000,
    accepted_tokens=2645,
    per_position=(0.74, 0.61, 0.48, 0.39, 0.34),
)


def stats_from(k: int, per_position: tuple[float, ...], drafts: float = 1000) -> AcceptanceStats:
    """Window stats whose per-position acceptance sums to the accepted tokens (as vLLM's)."""
    accepted = sum(per_position) * drafts
    return AcceptanceStats(
        rate=accepted / (drafts * k),
        mean_length=1 + accepted / drafts,
        drafts=drafts,
        draft_tokens=drafts * k,
        accepted_tokens=accepted,
        per_position=per_position,
    )


def test_expected_tokens_is_leviathan_eq1() -> None:
    assert expected_tokens(5, 0.0) == 1.0
    assert expected_tokens(5, 1.0) == 6.0
    assert expected_tokens(3, 0.5) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    for k, a in [(1, 0.3), (5, 0.8), (8, 0.95)]:
        assert fit_alpha(expected_tokens(k, a), k) == pytest.approx(a, abs=1e-9)
    assert (fit_alpha(0.5, 3), fit_alpha(9.0, 3)) == (0.0, 1.0)


def test_h200_ngram_figures_keep_k5() -> None:
    advice = advise(NGRAM, H200)
    assert advice is not None
    assert (advice.current_k, advice.recommended_k) == (5, 5)
    assert advice.alpha == pytest.approx(0.79423, abs=1e-5)
    assert expected_tokens(5, advice.alpha) == pytest.approx(3.64)
    assert advice.rate == 0.529  # vLLM's accepted / drafted: (E(5) - 1) / 5, not alpha
    assert advice.tokens_per_step_current == advice.tokens_per_step_recommended == 3.64
    assert advice.reason == "rate 52.9% between 50% and 70%, all 5 positions clear 0.30: keep k"
    assert advice.speculative_config == (
        '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4,"prompt_lookup_min":2}'
    )


@pytest.mark.parametrize(
    ("floor", "k", "tokens", "dropped"),
    [(0.35, 4, 3.30, "position 5"), (0.4, 3, 2.91, "positions 4-5"), (0.5, 2, 2.43, "3-5")],
)
def test_h200_positions_under_a_higher_floor_are_dropped(
    floor: float, k: int, tokens: float, dropped: str
) -> None:
    advice = advise(NGRAM, H200, Knobs(position_floor=floor))
    assert advice is not None and advice.recommended_k == k
    assert advice.tokens_per_step_recommended == pytest.approx(tokens)  # 3.64 - dropped p_i
    assert dropped in advice.reason and "wasted verification work" in advice.reason
    assert f'"num_speculative_tokens":{k}' in advice.speculative_config


def test_h200_counters_through_a_window() -> None:
    """The same per-position shares as cumulative counters over two scrapes: 1000 drafts."""
    window = AcceptanceWindow(window_s=60)
    window.add(0.0, SpecCounters(500, 2500, 1000, (300, 250, 200, 150, 100)))
    window.add(30.0, SpecCounters(1500, 7500, 3560, (1040, 860, 680, 540, 440)))
    stats = window.stats()
    assert stats is not None
    assert stats.per_position == pytest.approx((0.74, 0.61, 0.48, 0.39, 0.34))
    assert (stats.rate, stats.mean_length) == pytest.approx((0.512, 3.56))
    advice = advise(NGRAM, stats)
    assert advice is not None and advice.recommended_k == 5


def test_recorded_cpu_pages() -> None:
    """tests/data: a real ngram server, 18 drafts (90 drafted, 59 accepted)."""
    before = parse_vllm_metrics((DATA / "vllm-ngram-metrics-before.txt").read_text()).spec
    after = parse_vllm_metrics((DATA / "vllm-ngram-metrics-after.txt").read_text()).spec
    assert before is not None and after is not None
    window = AcceptanceWindow(window_s=60)
    window.add(0.0, before)
    window.add(2.0, after)
    stats = window.stats()
    advice = advise(NGRAM, stats)
    assert advice is not None and advice.recommended_k == 5
    assert advice.reason == "18 drafts measured, 50 needed: keep k=5"
    advice = advise(NGRAM, stats, Knobs(min_drafts=10))
    assert advice is not None and advice.recommended_k == 5
    assert advice.rate == pytest.approx(59 / 90)
    assert advice.alpha == pytest.approx(0.86241, abs=1e-5)
    assert advice.reason.startswith("rate 65.6% between 50% and 70%")


def test_bad_draft_goes_to_k1_and_says_change_the_draft() -> None:
    """The 8-layer local draft: about 1.5% acceptance."""
    advice = advise(DRAFT, stats_from(3, (0.03, 0.01, 0.005), drafts=300))
    assert advice is not None and advice.recommended_k == 1
    assert "change the draft" in advice.reason
    assert "costs more than it saves" in advice.reason  # 1.03 tokens for 1.1 steps
    assert advice.speedup_recommended == pytest.approx(1.03 / 1.1)
    assert advice.speculative_config == (
        '{"method":"draft_model","model":"draft-8l","num_speculative_tokens":1}'
    )


def test_perfect_draft_raises_k_at_most_doubling() -> None:
    """The self-draft: 100% acceptance, mean length k + 1."""
    perfect = stats_from(3, (1.0, 1.0, 1.0))
    advice = advise(DRAFT, perfect)
    assert advice is not None and advice.recommended_k == 6
    assert advice.tokens_per_step_recommended == pytest.approx(7.0)
    assert advice.speedup_recommended == pytest.approx(7.0 / 1.6)
    advice = advise(DRAFT, perfect, Knobs(max_k=4))
    assert advice is not None and advice.recommended_k == 4


def test_high_rate_raise_is_trimmed_by_the_cost_model() -> None:
    stats = stats_from(3, (0.9, 0.8, 0.72))  # rate 80.7%, fitted a = 0.896
    cheap = advise(DRAFT, stats)
    costly = advise(DRAFT, stats, Knobs(draft_cost=0.3))
    assert cheap is not None and costly is not None
    assert (cheap.recommended_k, costly.recommended_k) == (6, 5)
    assert "cost model (c=0.3) prefers k=5" in costly.reason


def test_low_rate_lowers_k_by_one_at_least() -> None:
    """Every position clears the floor, but the rate is under 0.5: the rule of thumb lowers."""
    spec = Speculation(method="ngram", num_speculative_tokens=4)
    advice = advise(spec, stats_from(4, (0.45, 0.40, 0.35, 0.32)))
    assert advice is not None and advice.recommended_k == 3
    assert advice.tokens_per_step_recommended == pytest.approx(2.20)


def test_window_follows_a_collapse() -> None:
    """Counter series: 40 s of a good ngram workload (rate 0.8), then 40 s of chat (0.1)."""
    window = AcceptanceWindow(window_s=30)
    drafts, per_pos = 0.0, [0.0] * 5
    recommended = []
    for second in range(0, 80, 2):
        shares = (0.95, 0.85, 0.8, 0.75, 0.65) if second < 40 else (0.3, 0.1, 0.05, 0.03, 0.02)
        drafts += 20
        per_pos = [p + 20 * s for p, s in zip(per_pos, shares, strict=True)]
        accepted = sum(per_pos)
        window.add(float(second), SpecCounters(drafts, drafts * 5, accepted, tuple(per_pos)))
        advice = advise(NGRAM, window.stats())
        assert advice is not None
        recommended.append(advice.recommended_k)
    assert recommended[:2] == [5, 5]  # fewer than 50 drafts in the window yet
    assert recommended[5:20] == [10] * 15  # rate 80%: raise, at most doubling
    assert recommended[-1] == 1  # 0.3 at position 1, then under the floor


def test_plain_backend_and_no_data() -> None:
    assert advise(Speculation(), None) is None
    advice = advise(NGRAM, None)
    assert advice is not None and advice.recommended_k == 5 and advice.rate is None
    assert config_json(NGRAM, 2) == (
        '{"method":"ngram","num_speculative_tokens":2,"prompt_lookup_max":4,"prompt_lookup_min":2}'
    )


def test_an_idle_window_falls_back_to_the_counters_since_start() -> None:
    """A server with 1000 drafts behind it (H200 shares) and an idle last minute."""
    lifetime = SpecCounters(1000, 5000, 2560, (740, 610, 480, 390, 340))
    idle = AcceptanceWindow(window_s=60)
    idle.add(0.0, lifetime)
    idle.add(58.0, lifetime)
    assert idle.stats() is None
    advice = advise_window(NGRAM, idle)
    assert advice is not None and advice.window == "since server start"
    assert (advice.rate, advice.recommended_k) == (pytest.approx(0.512), 5)
    busy = AcceptanceWindow(window_s=60)
    busy.add(0.0, lifetime)
    busy.add(30.0, SpecCounters(1100, 5500, 2660, (840, 610, 480, 390, 340)))
    advice = advise_window(NGRAM, busy)  # 100 drafts in the window, only position 1 hit
    assert advice is not None and advice.window == "last 30 s"
    assert (advice.rate, advice.recommended_k) == (pytest.approx(0.2), 1)
    fresh = AcceptanceWindow()
    advice = advise_window(NGRAM, fresh)
    assert advice is not None and advice.window == "no data" and advice.recommended_k == 5
