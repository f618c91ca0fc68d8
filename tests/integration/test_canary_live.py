"""One real canary round against the real float32 vLLM CPU backends: speculation is lossless,
so every prompt's greedy tokens match the plain twin's (no fault, not even a near-tie)."""

from __future__ import annotations

import httpx
import pytest

from contracts.config import GatewayConfig
from gateway.upstream.canary import CANARY_PROMPTS, Canary
from gateway.upstream.state import BackendRegistry, Backends

pytestmark = pytest.mark.integration


async def test_canary_round_finds_no_fault_in_float32(stack_config: GatewayConfig) -> None:
    registry = BackendRegistry(stack_config.backends)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0, connect=5.0)) as client:
        canary = Canary(
            Backends(client, lambda: stack_config, registry),
            interval_s=300,
            near_tie_margin=0.1,
            max_tokens=24,
            timeout_s=300,
        )
        await canary.run_round()
    report = canary.to_json()["backends"]
    assert set(report) == {"ngram", "draft", "eagle3"}
    for name in ("ngram", "draft", "eagle3"):
        assert report[name]["twin"] == "plain"
        assert report[name]["last_round"]["matched"] == len(CANARY_PROMPTS), report[name]
        assert registry.states[name].suspect is None
