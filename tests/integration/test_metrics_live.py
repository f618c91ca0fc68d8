"""The gateway's /metrics in front of the real vLLM CPU backends: request counts, latency
histograms and tokens equal the traffic sent; acceptance gauges equal /routes' figures."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import MODEL

pytestmark = pytest.mark.integration

CODE_PROMPT = (
    "def bubble_sort(items):\n    n = len(items)\n    for i in range(n):\n"
    "        for j in range(n - i - 1):\n            if items[j] > items[j + 1]:\n"
    "                items[j], items[j + 1] = items[j + 1], items[j]\n    return items\n\n\n"
    "def insertion_sort(items):\n"
)
#: (task header, body extras): 4 code at temperature 0 (speculative pool), 2 creative (plain),
#: 1 streamed chat with usage.
TRAFFIC: list[tuple[str, dict[str, Any]]] = [("code", {"temperature": 0})] * 4 + [
    ("creative", {"temperature": 1.0}),
    ("creative", {"temperature": 1.0}),
    ("chat", {"temperature": 0.2, "stream": True, "stream_options": {"include_usage": True}}),
]


def samples(gateway_url: str) -> list[Any]:
    text = httpx.get(f"{gateway_url}/metrics").text
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def values(all_samples: list[Any], name: str, backend: str) -> list[float]:
    return [s.value for s in all_samples if s.name == name and s.labels["backend"] == backend]


def usage_tokens(sse: str) -> int:
    """``usage.completion_tokens`` of a stream's usage chunk (``include_usage``)."""
    for line in sse.splitlines():
        data = line.removeprefix("data: ")
        if line.startswith("data: {") and '"usage"' in data:
            usage = json.loads(data).get("usage")
            if usage:
                return int(usage["completion_tokens"])
    raise AssertionError("no usage in the stream")


def total(all_samples: list[Any], name: str, **labels: str) -> float:
    return sum(
        s.value
        for s in all_samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def test_counts_histograms_and_acceptance(gateway_url: str) -> None:
    sent: Counter[tuple[str, str, str, str]] = Counter()
    tokens = 0
    with httpx.Client(base_url=gateway_url, timeout=300) as client:
        for task, extra in TRAFFIC:
            body = {"model": MODEL, "prompt": CODE_PROMPT, "max_tokens": 32} | extra
            resp = client.post("/v1/completions", json=body, headers={"x-task-type": task})
            assert resp.status_code == 200, resp.text
            h = resp.headers
            key = (h["x-specgate-backend"], h["x-specgate-rule"], h["x-specgate-task"], "200")
            sent[key] += 1
            tokens += (
                usage_tokens(resp.text)
                if extra.get("stream")
                else (resp.json()["usage"]["completion_tokens"])
            )
    n = len(TRAFFIC)
    time.sleep(1.5)  # three polls (interval 0.5 s): the backends' counters are scraped
    metrics = samples(gateway_url)
    counted = Counter(
        {
            tuple(s.labels[k] for k in ("backend", "rule", "task", "status")): s.value
            for s in metrics
            if s.name == "specgate_requests_total"
        }
    )
    assert counted == sent and sum(counted.values()) == n
    assert total(metrics, "specgate_request_duration_seconds_count") == n
    assert total(metrics, "specgate_time_to_first_token_seconds_count") == n
    assert total(metrics, "specgate_inter_token_latency_seconds_count") >= 1  # the stream
    assert total(metrics, "specgate_completion_tokens_total") == tokens > 0
    for name in ("plain", "ngram", "draft", "eagle3"):
        assert total(metrics, "specgate_backend_healthy", backend=name) == 1.0
        assert total(metrics, "specgate_backend_inflight", backend=name) == 0.0
    assert_acceptance_matches_routes(gateway_url)


def assert_acceptance_matches_routes(gateway_url: str) -> None:
    """The acceptance gauges equal /routes' figures (read between two equal /routes reads,
    so a poll in between cannot make them differ)."""
    for _ in range(5):
        before = httpx.get(f"{gateway_url}/routes").json()["backends"]
        metrics = samples(gateway_url)
        after = httpx.get(f"{gateway_url}/routes").json()["backends"]
        if [b["acceptance"] for b in before] == [b["acceptance"] for b in after]:
            break
    measured = [b for b in after if b["acceptance"]]
    assert measured, "no speculative backend drafted anything"
    for b in after:
        name = b["name"]
        rate = values(metrics, "specgate_backend_acceptance_rate", name)
        length = values(metrics, "specgate_backend_mean_acceptance_length", name)
        if b["acceptance"] is None:
            assert rate == [] and length == []
            continue
        assert rate == [b["acceptance"]["rate"]]
        assert length == [b["acceptance"]["mean_length"]]
        advised = total(metrics, "specgate_backend_recommended_speculative_tokens", backend=name)
        assert advised == b["advice"]["recommended_k"]
