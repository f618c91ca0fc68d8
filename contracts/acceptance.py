"""Windowed acceptance of a speculative backend, from its cumulative vLLM counters.

vLLM exports cumulative counters (``vllm:spec_decode_num_drafts_total``,
``..._num_draft_tokens_total``, ``..._num_accepted_tokens_total``). Over a sliding window of
scrapes, the acceptance rate is delta accepted / delta draft tokens, and the mean acceptance
length is 1 + delta accepted / delta drafts (vLLM ``v1/spec_decode/metrics.py``). Pure code:
the caller passes scrape times in.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class SpecCounters:
    """Cumulative speculative-decoding counters of one scrape (tokens and draft steps).

    ``accepted_per_pos`` maps draft position (0-based) to accepted tokens at that position
    (``vllm:spec_decode_num_accepted_tokens_per_pos_total``).
    """

    drafts: float
    draft_tokens: float
    accepted_tokens: float
    accepted_per_pos: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class AcceptanceStats:
    """Acceptance over a window: rate in [0, 1], mean acceptance length in tokens per step
    (1 + accepted per draft step), the deltas behind them, and per-position acceptance
    (accepted at position i / drafts)."""

    rate: float
    mean_length: float
    drafts: float
    draft_tokens: float
    accepted_tokens: float
    per_position: tuple[float, ...]


@dataclass
class AcceptanceWindow:
    """Counter samples over the last ``window_s`` seconds.

    :meth:`add` takes a scrape; a counter that went down (backend restart) clears the window.
    :meth:`stats` gives the window's acceptance, or None when no tokens were drafted in it.
    """

    window_s: float = 60.0
    samples: deque[tuple[float, SpecCounters]] = field(default_factory=deque)

    def add(self, now: float, counters: SpecCounters) -> None:
        """Record one scrape taken at ``now`` (seconds, any monotonic clock)."""
        if self.samples and counters.draft_tokens < self.samples[-1][1].draft_tokens:
            self.samples.clear()
        self.samples.append((now, counters))
        # Keep the newest sample at or before the window start as the baseline.
        while len(self.samples) > 2 and self.samples[1][0] <= now - self.window_s:
            self.samples.popleft()

    def stats(self) -> AcceptanceStats | None:
        """Acceptance between the oldest and newest sample; None without drafted tokens."""
        if len(self.samples) < 2:
            return None
        first, last = self.samples[0][1], self.samples[-1][1]
        draft_tokens = last.draft_tokens - first.draft_tokens
        drafts = last.drafts - first.drafts
        if draft_tokens <= 0 or drafts <= 0:
            return None
        accepted = last.accepted_tokens - first.accepted_tokens
        base = first.accepted_per_pos
        per_pos = tuple(
            (v - (base[i] if i < len(base) else 0.0)) / drafts
            for i, v in enumerate(last.accepted_per_pos)
        )
        return AcceptanceStats(
            rate=accepted / draft_tokens,
            mean_length=1.0 + accepted / drafts,
            drafts=drafts,
            draft_tokens=draft_tokens,
            accepted_tokens=accepted,
            per_position=per_pos,
        )


def is_demoted(
    stats: AcceptanceStats | None, min_rate: float | None, min_draft_tokens: float
) -> bool:
    """True when the window holds at least ``min_draft_tokens`` drafted tokens and its rate
    is below ``min_rate``. The seed's rule of thumb: under 0.5 acceptance, a model draft
    stops paying; a free proposer (ngram) pays at lower rates (see config/local.yaml)."""
    if stats is None or min_rate is None:
        return False
    return stats.draft_tokens >= min_draft_tokens and stats.rate < min_rate
