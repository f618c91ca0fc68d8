"""The fake vLLM server's sampled completions from a toy target model
(:class:`bench.toy_lm.ToyLM`), for the distribution canary.

A behaviour with ``lm`` set answers non-streamed ``/v1/completions`` as vLLM does with
``return_token_ids`` (``choices[0].token_ids`` and ``prompt_token_ids``) and
``prompt_logprobs`` (per prompt position None for the first, else
``{"<id>": {"logprob", "rank", "decoded_token"}}``), sampling at the request's
temperature; ``sample_fault`` replaces that share of sampled tokens with random ones
(greedy untouched), the fault the canary must catch. Text prompts are tokenized one id per
whitespace-separated word.
"""

from __future__ import annotations

import random
import zlib
from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse, Response

if TYPE_CHECKING:
    from tests.fakes.fake_vllm import FakeBehaviour


def word_ids(text: str, vocab: int) -> list[int]:
    """The fake tokenizer: one id per whitespace-separated word."""
    return [zlib.crc32(w.encode()) % vocab for w in text.split()] or [0]


def lm_completion(b: FakeBehaviour, body: dict[str, Any], rng: random.Random) -> Response:
    """The answer of a fake with ``b.lm`` to a non-streamed ``/v1/completions``."""
    lm = b.lm
    assert lm is not None
    prompt = body.get("prompt")
    ids = [int(t) for t in prompt] if isinstance(prompt, list) else word_ids(str(prompt), lm.vocab)
    given = body.get("temperature")
    temperature = 1.0 if given is None else float(given)
    n = int(body.get("max_tokens") or b.tokens)
    out = lm.generate(ids, n, temperature, rng, b.sample_fault)
    choice: dict[str, Any] = {
        "index": 0,
        "text": "".join(f" t{t}" for t in out),
        "finish_reason": "length",
        "logprobs": None,
    }
    if body.get("return_token_ids"):
        choice["token_ids"] = out
        choice["prompt_token_ids"] = ids
    if body.get("prompt_logprobs") is not None:
        steps: list[dict[str, Any] | None] = [None]
        for i in range(1, len(ids)):
            lp = lm.logprob(ids[:i], ids[i])
            steps.append({str(ids[i]): {"logprob": lp, "rank": 1, "decoded_token": f" t{ids[i]}"}})
        choice["prompt_logprobs"] = steps
    usage = {"prompt_tokens": len(ids), "completion_tokens": n, "total_tokens": len(ids) + n}
    return JSONResponse(
        {
            "id": "cmpl-fake",
            "object": "text_completion",
            "created": 0,
            "model": b.model,
            "choices": [choice],
            "usage": usage,
            "served_by": b.name,
        }
    )
