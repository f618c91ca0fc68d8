"""A toy target language model with exact, cheap sampling and scoring, for the distribution
canary's fakes and bench.

Per context (a hash of its last 8 token ids) the vocabulary is put in a rotated order; the
token of rank ``j`` has the raw logit ``-1.2 ln(j + 1)`` in the head (``j < 16``, a Zipf law,
as the top of real next-token distributions roughly follows) and, in the tail, logits
falling linearly from ``-13`` to ``-33`` over the remaining ranks. With ``V = 49152``
(SmolLM2's vocabulary) tail tokens score about -14 to -34 under the target: half of a
uniformly random token's log-probabilities fall below -25, the spread a small real model
shows for tokens it would not say. Sums over the tail are geometric series, so sampling at
any temperature is exact (inverse CDF) and costs O(head) per token.
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

HEAD = 16
CONTEXT = 8


@dataclass(frozen=True, slots=True)
class ToyLM:
    """The model (module docstring): ``vocab`` tokens, tail logits from ``tail_top`` down
    by ``tail_span`` nats."""

    vocab: int = 49_152
    tail_top: float = -13.0
    tail_span: float = 20.0

    def _base(self, context: Sequence[int]) -> int:
        data = ",".join(map(str, context[-CONTEXT:])).encode()
        return zlib.crc32(data) % self.vocab

    def _logit(self, rank: int) -> float:
        if rank < HEAD:
            return -1.2 * math.log(rank + 1)
        return self.tail_top - self.tail_span * (rank - HEAD) / (self.vocab - HEAD - 1)

    def _masses(self, temperature: float) -> tuple[list[float], float, float]:
        """Head weights, the tail's total weight and its ratio ``r`` at ``temperature``."""
        head = [math.exp(self._logit(j) / temperature) for j in range(HEAD)]
        m = self.vocab - HEAD
        r = math.exp(-self.tail_span / (m - 1) / temperature)
        tail = math.exp(self.tail_top / temperature) * (1 - r**m) / (1 - r)
        return head, tail, r

    def logprob(self, context: Sequence[int], token: int) -> float:
        """``log p(token | context)`` at temperature 1 (nats)."""
        head, tail, _ = self._masses(1.0)
        rank = (token - self._base(context)) % self.vocab
        return self._logit(rank) - math.log(sum(head) + tail)

    def sample(self, context: Sequence[int], temperature: float, rng: random.Random) -> int:
        """One token from ``p(. | context)`` at ``temperature`` (0: the argmax)."""
        base = self._base(context)
        if temperature <= 0:
            return base
        head, tail, r = self._masses(temperature)
        u = rng.random() * (sum(head) + tail)
        for j, w in enumerate(head):
            if u < w:
                return (base + j) % self.vocab
            u -= w
        m = self.vocab - HEAD
        v = rng.random() * (1 - r**m)
        i = min(m - 1, int(math.log1p(-v) / math.log(r)))
        return (base + HEAD + i) % self.vocab

    def generate(
        self,
        prompt: Sequence[int],
        n: int,
        temperature: float,
        rng: random.Random,
        fault_rate: float = 0.0,
    ) -> list[int]:
        """``n`` tokens after ``prompt``; with ``fault_rate``, each *sampled* token is
        replaced by a uniformly random one with that probability (greedy untouched)."""
        out: list[int] = []
        for _ in range(n):
            token = self.sample([*prompt, *out], temperature, rng)
            if temperature > 0 and fault_rate and rng.random() < fault_rate:
                token = rng.randrange(self.vocab)
            out.append(token)
        return out


def word_ids(text: str, vocab: int) -> list[int]:
    """A toy tokenizer: one id per whitespace-separated word."""
    return [zlib.crc32(w.encode()) % vocab for w in text.split()] or [0]


def completion_answer(
    lm: ToyLM, body: dict[str, Any], rng: random.Random, fault_rate: float = 0.0
) -> dict[str, Any]:
    """vLLM's non-streamed ``/v1/completions`` answer from ``lm``: sampled at the request's
    temperature (absent: 1.0), ``token_ids``/``prompt_token_ids`` with ``return_token_ids``
    (else null),
    ``prompt_logprobs`` (per position None for the first, else ``{"<id>": {"logprob",
    "rank", "decoded_token"}}``) when asked; ``fault_rate`` of sampled tokens made random."""
    prompt = body.get("prompt")
    ids = [int(t) for t in prompt] if isinstance(prompt, list) else word_ids(str(prompt), lm.vocab)
    given = body.get("temperature")
    n = int(body.get("max_tokens") or 16)
    out = lm.generate(ids, n, 1.0 if given is None else float(given), rng, fault_rate)
    choice: dict[str, Any] = {
        "index": 0,
        "text": "".join(f" t{t}" for t in out),
        "finish_reason": "length",
        "logprobs": None,
    }
    asked = bool(body.get("return_token_ids"))  # vLLM sends both as null otherwise
    choice["token_ids"] = out if asked else None
    choice["prompt_token_ids"] = ids if asked else None
    if body.get("prompt_logprobs") is not None:
        steps: list[dict[str, Any] | None] = [None]
        for i in range(1, len(ids)):
            lp = lm.logprob(ids[:i], ids[i])
            steps.append({str(ids[i]): {"logprob": lp, "rank": 1, "decoded_token": f" t{ids[i]}"}})
        choice["prompt_logprobs"] = steps
    usage = {"prompt_tokens": len(ids), "completion_tokens": n, "total_tokens": len(ids) + n}
    return {
        "id": "cmpl-toy",
        "object": "text_completion",
        "created": 0,
        "choices": [choice],
        "usage": usage,
    }
