"""The distribution canary's statistics: is a backend's sampled output a sample of the target?

Pure math (``math`` only, no I/O). Notation: ``V`` the vocabulary size, ``f`` the *floor* (a
log-probability in nats), ``T`` the sampling temperature. A sampled token is a **tail token**
when its log-probability under the target, as a plain backend scores it (``prompt_logprobs``
on the prompt + sampled ids), is below ``f``.

Null hypothesis H0: the backend samples from the target at temperature ``T`` (no logit
processing), as speculative decoding promises (Leviathan et al. 2023, "Fast Inference from
Transformers via Speculative Decoding", Theorem 1; Chen et al. 2023 for the same result).

**Analytic bound, T <= 1** (:func:`tail_bound`). Under H0 the chance that the next token is a
tail token, given any context, is at most ``eps = V * e^f``:

* at ``T = 1`` the tail tokens are at most ``V`` tokens each with probability below ``e^f``;
* at ``T < 1`` the tempered distribution ``p_T(x) ~ p(x)^(1/T)`` has likelihood ratio
  ``p_T/p ~ p^(1/T - 1)``, increasing in ``p``: it moves mass from low to high
  probabilities, so the mass of the lower set ``{x: p(x) < e^f}`` only shrinks (monotone
  likelihood ratio implies first-order stochastic dominance).

Above ``T = 1`` no such bound holds (tempering flattens the distribution), so there the null
rate is bounded from plain's own samples of the same prompts at the same temperature, scored
the same way (:func:`rate_upper_bound`, Clopper-Pearson one-sided upper bound, 1934). Where
both exist the smaller is used; each is a valid bound on its own (the union costs at most the
bound's own error level, counted below). ``numerics_slack`` nats are added to the floor in the
bound: the plain scorer's logits differ from the tested engine's by numerics (bf16 vs fp32,
batch), and a difference of ``d`` nats in a log-probability moves a probability by ``e^d``.

**The test** (:func:`binom_sf`). A stream is one (backend, temperature band). Its evidence is
the tail count ``k`` among the ``n`` sampled tokens of its recent rounds (a sliding window).
Tokens of one completion are not independent, but under H0 each token's *conditional* tail
probability given everything before it is at most ``eps``, so ``k`` is stochastically
dominated by Binomial(``n``, ``eps``) whatever the dependence (a coupling argument: draw each
token's tail event as ``U_t < q_t`` with ``q_t <= eps`` and i.i.d. uniforms ``U_t``). The
p-value ``P(Binomial(n, eps) >= k)`` is therefore valid (conservative). The analytic case is
exact in this sense; the Clopper-Pearson case additionally treats plain's tail events as
independent draws at the prompt mix's average rate (approximate: same prompts, same
temperature, same scorer on both sides).

**False-alarm rate with repeated rounds** (:func:`per_test_alpha`). Every round tests each
stream once. With ``S`` streams and ``R`` rounds per hour, and each test (plus its plain
bound, when used) run at level ``alpha = alpha_hour / (2 * S * R)``, the union bound gives
P(any false alarm in any given hour) <= ``alpha_hour``, whatever the dependence between
overlapping windows (Bonferroni; the price of re-testing an overlapping window every round is
paid in ``alpha``, not assumed away). Over a day that is at most ``24 * alpha_hour`` expected
false alarms. This is an alpha-spending scheme with a constant spend per test: unlike a single
fixed-size test repeated "until it fires", it bounds the false-alarm rate per unit of time.
"""

from __future__ import annotations

import math


def log_binom_pmf(k: int, n: int, p: float) -> float:
    """``log P(Binomial(n, p) = k)`` (natural log); ``-inf`` where the probability is 0."""
    if k < 0 or k > n:
        return -math.inf
    if p <= 0.0:
        return 0.0 if k == 0 else -math.inf
    if p >= 1.0:
        return 0.0 if k == n else -math.inf
    log_choose = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
    return log_choose + k * math.log(p) + (n - k) * math.log1p(-p)


def binom_sf(k: int, n: int, p: float) -> float:
    """``P(Binomial(n, p) >= k)``: the one-sided p-value of ``k`` tail tokens among ``n``
    under a null tail rate ``p``. Exact sum of the probability mass (log-space terms, stopped
    once past the mode and below 1e-18 of the sum)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    total = 0.0
    mode = (n + 1) * p
    for j in range(k, n + 1):
        term = math.exp(log_binom_pmf(j, n, p))
        total += term
        if j > mode and term <= total * 1e-18:
            break
    return min(total, 1.0)


def tail_bound(vocab: int, floor: float, temperature: float, slack: float = 0.0) -> float | None:
    """The analytic per-token bound ``V * e^(floor + slack)`` on the chance of a tail token
    under H0 (module docstring), for ``0 < temperature <= 1``; None above 1, where no such
    bound holds. Capped at 1."""
    if temperature <= 0 or temperature > 1:
        return None
    return min(1.0, vocab * math.exp(floor + slack))


def rate_upper_bound(k: int, n: int, alpha: float) -> float:
    """One-sided Clopper-Pearson upper confidence bound on a Binomial rate at level
    ``alpha``: the ``q`` with ``P(Binomial(n, q) <= k) = alpha`` (found by bisection on the
    exact CDF; closed form ``1 - alpha^(1/n)`` for ``k = 0``). 1.0 for ``n = 0`` or ``k >= n``."""
    if n <= 0 or k >= n:
        return 1.0
    if k == 0:
        return 1.0 - math.pow(alpha, 1.0 / n)
    lo, hi = k / n, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if 1.0 - binom_sf(k + 1, n, mid) > alpha:
            lo = mid
        else:
            hi = mid
    return hi


def per_test_alpha(alpha_hour: float, streams: int, rounds_per_hour: float) -> float:
    """The level of one stream's test (and of its plain bound) in one round, so that all of
    an hour's tests together raise a false alarm with probability at most ``alpha_hour``:
    ``alpha_hour / (2 * streams * rounds_per_hour)`` (module docstring)."""
    return alpha_hour / (2.0 * max(streams, 1) * max(rounds_per_hour, 1.0))


def alarm_count(n: int, eps: float, alpha: float) -> int:
    """The smallest tail count among ``n`` tokens that raises the alarm at level ``alpha``
    under the null rate ``eps`` (``n + 1`` when none would)."""
    k = 1
    while k <= n and binom_sf(k, n, eps) > alpha:
        k += 1
    return k
