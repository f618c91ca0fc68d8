"""The fake vLLM server's sampled completions from a toy target model
(:class:`bench.toy_lm.ToyLM`), for the distribution canary.

A behaviour with ``lm`` set answers non-streamed ``/v1/completions`` as vLLM does with
``return_token_ids`` and ``prompt_logprobs`` (:func:`bench.toy_lm.completion_answer`),
sampling at the request's temperature; ``sample_fault`` replaces that share of sampled
tokens with random ones (greedy untouched), the fault the canary must catch.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse, Response

from bench.toy_lm import completion_answer

if TYPE_CHECKING:
    from tests.fakes.fake_vllm import FakeBehaviour


def lm_completion(b: FakeBehaviour, body: dict[str, Any], rng: random.Random) -> Response:
    """The answer of a fake with ``b.lm`` to a non-streamed ``/v1/completions``."""
    assert b.lm is not None
    answer = completion_answer(b.lm, body, rng, b.sample_fault)
    return JSONResponse(answer | {"model": b.model, "served_by": b.name})
