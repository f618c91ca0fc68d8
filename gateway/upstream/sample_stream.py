"""One distribution-canary stream (a backend in a temperature band): its sliding window of
scored samples, its verdict and its evidence. No I/O; the statistics are
:mod:`gateway.upstream.sample_stats`."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from gateway.upstream.sample_stats import alarm_count, binom_sf

Verdict = Literal["pending", "pass", "fail"]
#: Tail tokens kept as evidence per stream (the newest).
EVIDENCE_KEPT = 5


@dataclass(frozen=True, slots=True)
class Scored:
    """One sampled completion scored under the target: ``prompt`` (index into the canary's
    prompts; -1 for a live request), the sampled ``token_ids``, each one's log-probability
    under the target (``logprobs``, nats) and decoded text (``texts``, None where the scorer
    gave none); ``request``: the live request's id (None for the canary's own samples)."""

    prompt: int
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    texts: tuple[str | None, ...]
    request: str | None = None


@dataclass(frozen=True, slots=True)
class Evidence:
    """A tail token: where (``prompt`` id, 0-based ``position`` among the sampled tokens),
    what (``token_id``, ``token`` text), its ``logprob`` under the target, the ``band``
    and the ``temperature`` it was sampled at, when (unix ``time``) and, for a live
    request's token (``prompt`` -1), the request's id (``x-request-id``)."""

    prompt: int
    position: int
    token_id: int
    token: str | None
    logprob: float
    band: str
    temperature: float
    time: float
    request: str | None = None


def parse_prompt_logprobs(body: Any, ids: Sequence[int]) -> tuple[list[float], list[str | None]]:
    """The log-probability and text of each of ``ids`` from a vLLM ``/v1/completions`` answer
    to a token-id prompt with ``prompt_logprobs`` (``choices[0].prompt_logprobs``: per
    position None or ``{"<id>": {"logprob", "rank", "decoded_token"}}``). Raises
    ``ValueError`` when the answer has no log-probability for one of them."""
    try:
        steps = body["choices"][0]["prompt_logprobs"]
    except (KeyError, IndexError, TypeError):
        raise ValueError("answer without choices[0].prompt_logprobs") from None
    if not isinstance(steps, list) or len(steps) < len(ids):
        raise ValueError("prompt_logprobs shorter than the prompt")
    logprobs: list[float] = []
    texts: list[str | None] = []
    for i, token in enumerate(ids):
        step = steps[len(steps) - len(ids) + i]
        entry = step.get(str(token)) if isinstance(step, Mapping) else None
        if not isinstance(entry, Mapping) or not isinstance(entry.get("logprob"), int | float):
            raise ValueError(f"no prompt logprob for token {token} at {i}")
        logprobs.append(float(entry["logprob"]))
        text = entry.get("decoded_token")
        texts.append(text if isinstance(text, str) else None)
    return logprobs, texts


@dataclass(slots=True)
class Stream:
    """The window and verdict of one (backend, band): rounds ``(time, tokens, tail
    tokens)`` of the last ``window_s`` seconds, the last test's ``p_value``, null rate
    ``eps``, level ``alpha`` and ``alarm_at`` (tail tokens that would fail the window),
    totals since start and the newest tail tokens (``evidence``)."""

    window_s: float
    rounds: deque[tuple[float, int, int]] = field(default_factory=deque)
    verdict: Verdict = "pending"
    p_value: float | None = None
    eps: float | None = None
    alpha: float | None = None
    alarm_at: int | None = None
    tokens_total: int = 0
    tail_total: int = 0
    evidence: deque[Evidence] = field(default_factory=lambda: deque(maxlen=EVIDENCE_KEPT))
    note: str | None = None

    def add(
        self, now: float, samples: Sequence[Scored], floor: float, band: str, temperature: float
    ) -> None:
        """File one round's scored samples (``floor``: the tail's log-probability bound)."""
        n = k = 0
        for s in samples:
            rows = zip(s.token_ids, s.logprobs, s.texts, strict=True)
            for pos, (tid, lp, text) in enumerate(rows):
                n += 1
                if lp < floor:
                    k += 1
                    self.evidence.append(
                        Evidence(s.prompt, pos, tid, text, lp, band, temperature, now, s.request)
                    )
        self.rounds.append((now, n, k))
        self.tokens_total += n
        self.tail_total += k
        while self.rounds and self.rounds[0][0] < now - self.window_s:
            self.rounds.popleft()

    def counts(self) -> tuple[int, int]:
        """``(tokens, tail tokens)`` in the window."""
        return sum(r[1] for r in self.rounds), sum(r[2] for r in self.rounds)

    def judge(self, eps: float, alpha: float) -> Verdict:
        """Test the window against the null tail rate ``eps`` at level ``alpha`` and update
        the verdict: ``fail`` when the p-value is at most ``alpha``; a failed stream passes
        again only once its window holds no tail token at all (the faulty rounds have aged
        out and nothing new came), a hysteresis that keeps a backend faulty at a rate too
        low to fail every window from flapping."""
        n, k = self.counts()
        self.eps, self.alpha = eps, alpha
        self.p_value = binom_sf(k, n, eps)
        self.alarm_at = alarm_count(n, eps, alpha)
        if self.p_value <= alpha:
            self.verdict = "fail"
        elif self.verdict != "fail" or k == 0:
            self.verdict = "pass"
        return self.verdict

    def to_json(self) -> dict[str, Any]:
        """JSON-ready view for ``/routes``."""
        n, k = self.counts()
        return {
            "verdict": self.verdict,
            "window": {"tokens": n, "tail_tokens": k, "rounds": len(self.rounds)},
            "p_value": self.p_value,
            "null_tail_rate": self.eps,
            "alpha": self.alpha,
            "alarm_at_tail_tokens": self.alarm_at,
            "tokens_total": self.tokens_total,
            "tail_tokens_total": self.tail_total,
            "evidence": [asdict(e) for e in self.evidence],
            "note": self.note,
        }
