"""Live backend state on real vLLM CPU servers: acceptance from /metrics, and demotion of
the poor 8-layer draft for code traffic."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import httpx
import pytest

from contracts.config import GatewayConfig
from contracts.vllm_metrics import parse_vllm_metrics
from tests.integration.conftest import MODEL, backend_url

pytestmark = pytest.mark.integration

CODE_PROMPT = (
    "def quicksort(items):\n    if len(items) <= 1:\n        return items\n"
    "    pivot = items[0]\n    left = [x for x in items[1:] if x < pivot]\n"
    "    right = [x for x in items[1:] if x >= pivot]\n    return quicksort(left) + [pivot] + "
    "quicksort(right)\n\n\ndef mergesort(items):\n"
)


def backend_view(gateway_url: str, name: str) -> dict[str, Any]:
    routes = httpx.get(f"{gateway_url}/routes").json()
    return next(b for b in routes["backends"] if b["name"] == name)


def wait_for_scrape(gateway_url: str, name: str, after: float) -> dict[str, Any]:
    """The backend's /routes entry once the gateway scraped it after ``after`` (epoch s)."""
    deadline = time.time() + 15
    while time.time() < deadline:
        view = backend_view(gateway_url, name)
        if view["last_scrape"] and view["last_scrape"] > after:
            return view
        time.sleep(0.2)
    raise AssertionError(f"no scrape of {name} after {after}")


def test_acceptance_in_routes_equals_the_backend_counters(
    stack_config: GatewayConfig, gateway_url: str
) -> None:
    url = backend_url(stack_config, "ngram")
    start = parse_vllm_metrics(httpx.get(f"{url}/metrics").text).spec
    assert start is not None
    wait_for_scrape(gateway_url, "ngram", time.time())  # the window now holds `start`
    for _ in range(2):  # straight to the backend: only ngram's counters move
        httpx.post(
            f"{url}/v1/completions",
            timeout=300,
            json={"model": MODEL, "prompt": CODE_PROMPT, "max_tokens": 48, "temperature": 0},
        )
    end = parse_vllm_metrics(httpx.get(f"{url}/metrics").text).spec
    assert end is not None and end.draft_tokens > start.draft_tokens
    view = wait_for_scrape(gateway_url, "ngram", time.time())
    expected = (end.accepted_tokens - start.accepted_tokens) / (
        end.draft_tokens - start.draft_tokens
    )
    assert view["acceptance"]["rate"] == pytest.approx(expected, abs=1e-9)
    assert view["acceptance"]["mean_length"] == pytest.approx(
        1 + (end.accepted_tokens - start.accepted_tokens) / (end.drafts - start.drafts)
    )


def test_poor_draft_is_demoted_and_code_moves_off_it(static_gateway_url: str) -> None:
    """The rules' demotion (static policy: adaptive routing, the shipped default, would stop
    sending code to the slow draft before its window held enough drafts to demote it)."""
    gateway_url = static_gateway_url
    with httpx.Client(base_url=gateway_url, timeout=300) as client:
        body = {"model": MODEL, "prompt": CODE_PROMPT, "max_tokens": 96, "temperature": 0}
        served: Counter[str] = Counter()
        deadline = time.time() + 240
        while not backend_view(gateway_url, "draft")["demoted"]:
            assert time.time() < deadline, "the 8-layer draft was never demoted"
            resp = client.post("/v1/completions", json=body, headers={"X-Task-Type": "code"})
            served[resp.headers["x-specgate-backend"]] += 1
            time.sleep(1.0)  # let a scrape land
        view = backend_view(gateway_url, "draft")
        assert view["acceptance"]["rate"] < 0.1
        assert view["demotions"] >= 1
        after: Counter[str] = Counter()
        for _ in range(8):
            small = body | {"max_tokens": 8}
            resp = client.post("/v1/completions", json=small, headers={"X-Task-Type": "code"})
            after[resp.headers["x-specgate-backend"]] += 1
        # ngram and eagle3 take the code traffic; the rest is draft's probe share (5% of the
        # time it is kept, then it competes with the other two)
        assert after["ngram"] + after["eagle3"] >= 6, after
