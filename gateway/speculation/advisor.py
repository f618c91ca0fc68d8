"""Tuning advisor: which ``num_speculative_tokens`` (k) a speculative backend should use next.

Pure code. Input: the backend's :class:`~contracts.launch_profile.Speculation` (method, current
k) and its measured :class:`~contracts.acceptance.AcceptanceStats` over a window.

**The model.** Leviathan et al., 2023, "Fast Inference from Transformers via Speculative
Decoding" (ICML), eq. (1): with an i.i.d. per-token acceptance probability ``a``, one
verification step with k drafted tokens yields on average

    E(k) = (1 - a^(k+1)) / (1 - a)        tokens (the accepted prefix plus the target's own),

and with a draft step costing ``c`` target steps the wall-time improvement is
``E(k) / (1 + c*k)`` (their Theorem 3.8). We use ``c = 0`` for ngram/suffix (prompt lookup is
free CPU work), 0.05 for EAGLE/MTP heads and 0.1 for a separate draft model (about a 1B
draft for an 8B target); callers may pass their own.

**Deriving a from vLLM's counters.** vLLM's "acceptance rate" is accepted / drafted tokens,
which under Leviathan's model is ``(E(k) - 1) / k``, not ``a`` (a = 0.8, k = 5 gives a rate
of 0.54): using the rate as ``a`` would understate it. vLLM's mean acceptance length
``1 + accepted / drafts`` is the measured tokens per verification step, i.e. the measured
E(k). So ``a`` is the root of ``E(k; a) = mean_length`` (E is increasing in a from 1 to k+1;
solved by bisection). It is used only to extrapolate beyond the measured positions.

**Per-position acceptance.** ``per_position[i]`` = share of drafts whose position i was
accepted (vLLM accepts a prefix, so it is P(accepted length > i) and non-increasing). Cutting
the draft to ``j <= k`` tokens loses exactly the tokens of positions ``j..k-1``:
``T(j) = mean_length - sum(per_position[j:k])`` — measured, no i.i.d. assumption. Beyond k it
is extrapolated: ``per_position[j] ~ per_position[k-1] * a^(j-k+1)``. A position accepted in
fewer than ``position_floor`` (default 0.3) of the drafts is wasted verification work: each
drafted token takes a slot in the target's batch and KV cache, which stops being free as soon
as the target is not purely memory-bound (any batch above one, any CPU).

**The window** (:func:`advise_window`): the gateway's acceptance window; when it holds too
few drafts (idle traffic), the newest scrape's cumulative counters since server start.

**The rule** (the seed's rule of thumb, quantified by the above):

1. fewer than ``min_drafts`` drafts in the window: keep k (not enough data);
2. rate above ``raise_above`` (0.7) and every measured position clears the floor: raise k
   while the extrapolated next position clears it (at most doubling, at most ``max_k``);
3. rate below ``lower_below`` (0.5): lower k to the positions that clear the floor, by at
   least one; if not even the first position clears it, k = 1 and change the draft;
4. otherwise: drop trailing positions under the floor (if any), else keep k;
5. within the allowed range, pick the k maximising ``T(k) / (1 + c*k)``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Any

from contracts.acceptance import AcceptanceStats, AcceptanceWindow, SpecCounters
from contracts.launch_profile import Speculation

#: Draft cost per drafted token, relative to one target step (Leviathan's c), by method.
DRAFT_COST = {"ngram": 0.0, "suffix": 0.0, "eagle": 0.05, "eagle3": 0.05, "mtp": 0.05}
DEFAULT_DRAFT_COST = 0.1


@dataclass(frozen=True, slots=True)
class Advice:
    """The advisor's answer for one backend.

    ``rate`` (accepted / drafted) and ``mean_length`` (tokens per verification step) are the
    measured window figures (None without data); ``alpha`` is the fitted per-token acceptance;
    ``tokens_per_step_*`` the expected tokens per verification step at the current and the
    recommended k; ``speedup_*`` the same divided by the step cost ``1 + c*k`` (a model
    estimate against plain decoding, not a measurement); ``speculative_config`` the compact
    ``--speculative-config`` JSON for the recommended k; ``window`` what the figures cover
    (e.g. ``last 58 s`` or ``since server start``, set by :func:`advise_window`).
    """

    method: str
    current_k: int
    recommended_k: int
    rate: float | None
    mean_length: float | None
    alpha: float | None
    tokens_per_step_current: float | None
    tokens_per_step_recommended: float | None
    speedup_current: float | None
    speedup_recommended: float | None
    draft_cost: float
    reason: str
    speculative_config: str
    window: str = "window"

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return asdict(self)


def expected_tokens(k: int, alpha: float) -> float:
    """Leviathan et al. (2023) eq. (1): E(k) = (1 - a^(k+1)) / (1 - a); k + 1 when a = 1."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def fit_alpha(mean_length: float, k: int) -> float:
    """The per-token acceptance ``a`` in [0, 1] with ``expected_tokens(k, a) == mean_length``
    (clamped to [1, k + 1]; bisection to 1e-12)."""
    if mean_length <= 1.0:
        return 0.0
    if mean_length >= k + 1.0:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if expected_tokens(k, mid) < mean_length:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def config_json(spec: Speculation, k: int) -> str:
    """The compact ``--speculative-config`` JSON of ``spec`` with ``num_speculative_tokens=k``."""
    config = spec.model_copy(update={"num_speculative_tokens": k}).to_config()
    return json.dumps(config, separators=(",", ":"))


def _positions(stats: AcceptanceStats, k: int, alpha: float) -> list[float]:
    """Measured per-position acceptance for positions 0..k-1 (i.i.d. ``a^(i+1)`` where vLLM
    exported none)."""
    measured = list(stats.per_position[:k])
    return measured + [alpha ** (i + 1) for i in range(len(measured), k)]


def _tokens_per_step(stats: AcceptanceStats, p: list[float], alpha: float, j: int) -> float:
    """T(j): measured mean length minus dropped positions (j <= k), or plus extrapolated
    ones (j > k)."""
    k = len(p)
    if j <= k:
        return stats.mean_length - sum(p[j:])
    return stats.mean_length + sum(p[-1] * alpha**m for m in range(1, j - k + 1))


@dataclass(frozen=True, slots=True)
class Knobs:
    """The rule's thresholds (module docstring): a position accepted in fewer than
    ``position_floor`` of the drafts is wasted; raise k above rate ``raise_above``, lower it
    below ``lower_below``; advise only from ``min_drafts`` drafts on; never beyond ``max_k``;
    ``draft_cost``: Leviathan's c (None: :data:`DRAFT_COST` of the method)."""

    position_floor: float = 0.3
    raise_above: float = 0.7
    lower_below: float = 0.5
    min_drafts: float = 50
    max_k: int = 16
    draft_cost: float | None = None


DEFAULT_KNOBS = Knobs()


def advise(
    spec: Speculation, stats: AcceptanceStats | None, knobs: Knobs = DEFAULT_KNOBS
) -> Advice | None:
    """Recommend k for one backend (None for a plain backend); see the module docstring."""
    if not spec.speculative or spec.num_speculative_tokens is None:
        return None
    k, c = spec.num_speculative_tokens, knobs.draft_cost
    c = DRAFT_COST.get(spec.method, DEFAULT_DRAFT_COST) if c is None else c
    if stats is None or stats.drafts < knobs.min_drafts:
        seen, needed = 0 if stats is None else int(stats.drafts), knobs.min_drafts
        return _keep(spec, stats, c, f"{seen} drafts measured, {needed:g} needed: keep k={k}")
    alpha = fit_alpha(stats.mean_length, k)
    p = _positions(stats, k, alpha)
    allowed, why = _allowed(stats, p, alpha, knobs)

    def speedup(j: int) -> float:
        return _tokens_per_step(stats, p, alpha, j) / (1.0 + c * j)

    best = max(allowed, key=lambda j: (round(speedup(j), 9), j))
    if best < allowed[-1]:
        why += f"; cost model (c={c:g}) prefers k={best}"
    if speedup(best) < 1.0:
        why += "; the draft costs more than it saves even then: consider plain decoding"
    return Advice(
        method=spec.method,
        current_k=k,
        recommended_k=best,
        rate=stats.rate,
        mean_length=stats.mean_length,
        alpha=alpha,
        tokens_per_step_current=stats.mean_length,
        tokens_per_step_recommended=_tokens_per_step(stats, p, alpha, best),
        speedup_current=speedup(k),
        speedup_recommended=speedup(best),
        draft_cost=c,
        reason=why,
        speculative_config=config_json(spec, best),
    )


def _allowed(
    stats: AcceptanceStats, p: list[float], alpha: float, knobs: Knobs
) -> tuple[range, str]:
    """The rule's steps 2-4 (module docstring): the k the cost model may pick from, and
    why (``p``: per-position acceptance, :func:`_positions`)."""
    k, cut, rate = len(p), knobs.position_floor, stats.rate
    useful = next((i for i, v in enumerate(p) if v < cut), k)
    floor, high, low = f"{cut:.2f}", f"{knobs.raise_above:.0%}", f"{knobs.lower_below:.0%}"
    if rate > knobs.raise_above and useful == k:
        top = k
        while top < min(2 * k, knobs.max_k) and p[-1] * alpha ** (top - k + 1) >= cut:
            top += 1
        why = f"rate {rate:.1%} > {high}: raise k; positions predicted "
        return range(k, top + 1), why + f"(a={alpha:.3f}) to clear {floor} up to k={top}"
    if rate < knobs.lower_below and useful == 0:
        why = f"rate {rate:.1%} < {low} and position 1 accepted {p[0]:.2f} < {floor}: "
        return range(1, 2), why + "k=1, change the draft (or route away from it)"
    if rate < knobs.lower_below:
        allowed = range(1, min(useful, k - 1, knobs.max_k) + 1) if k > 1 else range(1, 2)
        why = f"rate {rate:.1%} < {low}: lower k (by one at least); "
        return allowed, why + f"{useful} of {k} positions clear {floor}"
    if useful < k:
        dropped = f"position {k}" if useful == k - 1 else f"positions {useful + 1}-{k}"
        return range(1, useful + 1), f"{dropped} accepted under {floor}: wasted verification work"
    why = f"rate {rate:.1%} between {low} and {high}, all {k} positions clear {floor}: keep k"
    return range(k, k + 1), why


def _keep(spec: Speculation, stats: AcceptanceStats | None, c: float, reason: str) -> Advice:
    k = spec.num_speculative_tokens or 0
    return Advice(
        method=spec.method,
        current_k=k,
        recommended_k=k,
        rate=None if stats is None else stats.rate,
        mean_length=None if stats is None else stats.mean_length,
        alpha=None,
        tokens_per_step_current=None if stats is None else stats.mean_length,
        tokens_per_step_recommended=None if stats is None else stats.mean_length,
        speedup_current=None,
        speedup_recommended=None,
        draft_cost=c,
        reason=reason,
        speculative_config=config_json(spec, k),
    )


def since_start(counters: SpecCounters) -> AcceptanceStats | None:
    """Acceptance over a server's whole life: its cumulative counters against zero (vLLM's
    counters start at zero and a restart resets them)."""
    window = AcceptanceWindow()
    window.add(0.0, SpecCounters(0.0, 0.0, 0.0))
    window.add(1.0, counters)
    return window.stats()


def advise_window(
    spec: Speculation, window: AcceptanceWindow, knobs: Knobs = DEFAULT_KNOBS
) -> Advice | None:
    """:func:`advise` over ``window``'s span; when that holds fewer than ``knobs.min_drafts``
    drafts (an idle or young window) and the newest scrape's cumulative counters hold more,
    over those instead: the server's whole life since start, a slower but valid window."""
    min_drafts = knobs.min_drafts
    stats = window.stats()
    label = "no data"
    if stats is not None:
        label = f"last {round(window.samples[-1][0] - window.samples[0][0], 1):g} s"
    if (stats is None or stats.drafts < min_drafts) and window.samples:
        lifetime = since_start(window.samples[-1][1])
        if lifetime is not None and lifetime.drafts > (0 if stats is None else stats.drafts):
            stats, label = lifetime, "since server start"
    advice = advise(spec, stats, knobs)
    return None if advice is None else replace(advice, window=label)
