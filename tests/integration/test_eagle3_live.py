"""The committed EAGLE-3 head on real vLLM CPU: it loads without its own embedding, it is
lossless against the plain backend, and it really speculates (vLLM's counters move)."""

from __future__ import annotations

import json

import httpx
import pytest
from safetensors import safe_open

from backends.drafts.gate_report import counter_delta, spec_counters
from backends.models import HEADS_DIR
from contracts.config import GatewayConfig
from tests.integration.conftest import MODEL, backend_url

pytestmark = pytest.mark.integration

HEAD = HEADS_DIR / "smollm2-135m-eagle3"
#: Chat and code prompts of the kinds the head was judged on (not from its training data).
PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Explain in two sentences why the sky is blue.",
    "Write a Python function that returns the factorial of n.",
    "Write a SQL query that counts the rows of the table orders per customer.",
]


def test_committed_head_has_no_embedding_and_fits_the_size_cap() -> None:
    with safe_open(str(HEAD / "model.safetensors"), framework="numpy") as handle:
        names = set(handle.keys())  # noqa: SIM118
    assert not any("embed_tokens" in name for name in names)
    assert {"fc.weight", "lm_head.weight", "d2t", "t2d"} <= names
    assert (HEAD / "model.safetensors").stat().st_size <= 25 * 1024 * 1024
    config = json.loads((HEAD / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]


def test_eagle3_is_lossless_and_speculates(stack_config: GatewayConfig) -> None:
    plain, eagle3 = backend_url(stack_config, "plain"), backend_url(stack_config, "eagle3")
    before = spec_counters(httpx.get(f"{eagle3}/metrics", timeout=30).text)
    for prompt in PROMPTS:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 48,
            "temperature": 0,
        }
        want = httpx.post(f"{plain}/v1/chat/completions", json=body, timeout=300).json()
        got = httpx.post(f"{eagle3}/v1/chat/completions", json=body, timeout=300).json()
        assert got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
        assert got["usage"]["completion_tokens"] == want["usage"]["completion_tokens"]
    after = spec_counters(httpx.get(f"{eagle3}/metrics", timeout=30).text)
    delta = counter_delta(after, before)
    assert delta.drafts > 0
    # A trained head: well over one token accepted per ten drafts (an untrained one gets 0).
    assert delta.accepted_tokens / delta.drafts > 0.3
