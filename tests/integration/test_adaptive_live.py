"""Per-request acceptance feedback and adaptive routing on real vLLM CPU servers started with
``--per-request-spec-decode-metrics summary`` (config/local.yaml)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from contracts.config import GatewayConfig
from gateway.app import create_app
from tests.fakes.servers import running_server
from tests.integration.conftest import MODEL, backend_url, live_settings

pytestmark = pytest.mark.integration

CODE = (
    "def {name}(items):\n    if len(items) <= 1:\n        return items\n"
    "    pivot = items[0]\n    left = [x for x in items[1:] if x < pivot]\n"
    "    right = [x for x in items[1:] if x >= pivot]\n    return {name}(left) + [pivot] + "
    "{name}(right)\n\n\ndef {other}(items):\n"
)
NAMES = ["quicksort", "qsort", "sort_items", "partition_sort", "fast_sort", "order", "arrange"]


def code_prompt(i: int) -> str:
    return CODE.format(name=NAMES[i % len(NAMES)], other=f"merge_{i}")


@pytest.fixture(scope="module")
def adaptive_url(stack_config: GatewayConfig) -> Iterator[str]:
    """A gateway whose code rule adaptively picks among eagle3, ngram and the 8-layer draft
    only (no plain fallback), with acceptance demotion off so only adaptive routing acts."""
    yield from adaptive_gateway(stack_config)


@pytest.fixture
def fresh_adaptive_url(stack_config: GatewayConfig) -> Iterator[str]:
    """The same, with nothing learnt yet (earlier tests in the module teach the first one)."""
    yield from adaptive_gateway(stack_config)


def adaptive_gateway(stack_config: GatewayConfig) -> Iterator[str]:
    config = stack_config.model_copy(deep=True)
    config.routing.min_acceptance_rate = 0.0
    for backend in config.backends.values():
        backend.min_acceptance_rate = None
    rule = next(r for r in config.rules if r.name == "code-rag-speculative")
    rule.policy, rule.fallbacks = "adaptive", []
    app = create_app(live_settings(), config=config)
    with running_server(app) as url:
        yield url


def record(url: str, request_id: str) -> dict[str, Any]:
    recent = httpx.get(f"{url}/routes").json()["adaptive"]["recent"]
    return next(r for r in recent if r["request_id"] == request_id)


def events(raw: bytes) -> list[Any]:
    """The stream's events, without the per-request ``id`` and ``created``."""
    out: list[Any] = []
    for block in raw.split(b"\n\n"):
        if not block.startswith(b"data: {"):
            out.append(block)
            continue
        event = json.loads(block[6:])
        out.append({k: v for k, v in event.items() if k not in ("id", "created")})
    return out


def test_recorded_acceptance_equals_the_json_answer(adaptive_url: str) -> None:
    body = {"model": MODEL, "prompt": code_prompt(0), "max_tokens": 48, "temperature": 0}
    resp = httpx.post(
        f"{adaptive_url}/v1/completions",
        json=body,
        headers={"X-Task-Type": "code", "x-request-id": "live-json"},
        timeout=300,
    )
    assert resp.status_code == 200
    spec = resp.json()["metrics"]["speculative_decoding"]  # passed through unchanged
    assert spec["num_draft_tokens"] > 0
    mine = record(adaptive_url, "live-json")
    assert mine["backend"] == resp.headers["x-specgate-backend"]
    assert mine["speculative_decoding"] == spec
    assert mine["acceptance_rate"] == pytest.approx(spec["draft_acceptance_rate"], abs=1e-12)
    assert mine["tokens"] == resp.json()["usage"]["completion_tokens"]


def test_stream_feedback_is_recorded_and_invisible(
    adaptive_url: str, stack_config: GatewayConfig
) -> None:
    body = {
        "model": MODEL,
        "prompt": code_prompt(1),
        "max_tokens": 48,
        "temperature": 0,
        "stream": True,
    }
    # The usage chunk is asked for once the backend's fingerprint is known (learnt from an
    # earlier answer): send until a backend answers a second time (at most 5 sends).
    seen: set[str] = set()
    for attempt in range(5):
        headers = {"X-Task-Type": "code", "x-request-id": f"live-stream-{attempt}"}
        with httpx.stream(
            "POST", f"{adaptive_url}/v1/completions", json=body, headers=headers, timeout=300
        ) as resp:
            through = resp.read()
            backend = resp.headers["x-specgate-backend"]
        if backend in seen:
            break
        seen.add(backend)
    url = backend_url(stack_config, backend)
    alone = httpx.post(f"{url}/v1/completions", json=body, timeout=300).content
    asked = body | {"stream_options": {"include_usage": True}}
    with_usage = httpx.post(f"{url}/v1/completions", json=asked, timeout=300).content
    assert b'"usage"' not in through
    assert events(through) == events(alone)  # same events, fingerprint in the same place
    final = next(e for e in events(with_usage) if isinstance(e, dict) and "usage" in e)
    mine = record(adaptive_url, headers["x-request-id"])
    assert mine["speculative_decoding"] == final["metrics"]["speculative_decoding"]
    assert mine["tokens"] == final["usage"]["completion_tokens"]


def test_the_truncated_draft_loses_its_code_traffic(fresh_adaptive_url: str) -> None:
    adaptive_url = fresh_adaptive_url
    served: list[str] = []
    with httpx.Client(base_url=adaptive_url, timeout=300) as client:
        for i in range(40):
            body = {
                "model": MODEL,
                "prompt": code_prompt(i),
                "max_tokens": 32,
                "temperature": 0,
                "stream": True,
            }
            resp = client.post("/v1/completions", json=body, headers={"X-Task-Type": "code"})
            assert resp.status_code == 200
            served.append(resp.headers["x-specgate-backend"])
    warm, after = Counter(served[:30]), Counter(served[30:])
    assert warm["draft"] >= 1, served  # it was tried
    assert after["ngram"] + after["eagle3"] >= 9, served  # and lost within the warm-up
    routes = httpx.get(f"{adaptive_url}/routes").json()["adaptive"]
    code = next(g for g in routes["groups"] if g["task"] == "code" and g["bucket"] == "*")
    # Compared with the backend that took the traffic over (eagle3 or ngram), not with ngram
    # alone: ngram's acceptance on these prompts was 0.05 in one CI run and 0.38 in another
    # (it is measured on the few requests the explorer gave it).
    winner = after.most_common(1)[0][0]
    draft, best = code["backends"]["draft"], code["backends"][winner]
    assert winner != "draft", served
    assert draft["acceptance_rate"] < 0.1, draft
    assert draft["acceptance_rate"] < best["acceptance_rate"], (draft, best)
    assert draft["speed_tps"] < best["speed_tps"], (draft, best)
