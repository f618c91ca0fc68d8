"""Seeds that reproduce: a seeded sampling request goes to one backend, whatever was learnt."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from contracts.config import ConfigError, GatewayConfig, parse_config
from gateway.classify.features import RequestFeatures
from gateway.routing.seeds import pin_seeded, seeded
from gateway.service import Gateway
from tests.unit.conftest import MODEL, InProcess, gateway_settings, in_process, local_config

CODE = "Write a Python function that checks whether a string is a palindrome."
SPECULATIVE = ("eagle3", "ngram", "draft")


def remote_config() -> GatewayConfig:
    """The shipped stack as backends specgate does not launch, with no guards: an engine
    whose sampled speculation is lossless (a GPU build), where seeded code requests may go to
    any of the three speculative backends."""
    config = local_config()
    backends = {n: b.model_copy(update={"local": False}) for n, b in config.backends.items()}
    return config.model_copy(update={"backends": backends})


def decision_for(config: GatewayConfig, order: tuple[str, ...]):  # type: ignore[no-untyped-def]
    features = RequestFeatures(MODEL, 0.5, True, "code", 1.0, "header", False)
    gateway = Gateway(config)
    decided = gateway.policy.decide(features, gateway.registry.snapshot(), random.Random(0))
    return replace(decided, backends=order)


@pytest.mark.parametrize(
    ("body", "pinned"),
    [
        ({"seed": 1, "temperature": 0.5}, True),
        ({"seed": 0}, True),  # temperature absent: 1.0, samples
        ({"seed": 1, "temperature": 0}, False),  # greedy: every backend agrees
        ({"seed": -1, "temperature": 0.5}, False),  # vLLM: no seed
        ({"seed": None, "temperature": 0.5}, False),
        ({"temperature": 0.5}, False),
    ],
)
def test_only_seeded_sampling_requests_are_pinned(body: dict[str, object], pinned: bool) -> None:
    assert seeded(body, 1.0) is pinned


def test_the_choice_ignores_the_try_lists_order() -> None:
    config = remote_config()
    body = {"seed": 3, "temperature": 0.5}
    firsts = set()
    for order in ((*SPECULATIVE, "plain"), ("draft", "ngram", "eagle3", "plain")):
        pinned = pin_seeded(config, decision_for(config, order), body, "key-1")
        firsts.add(pinned.backends[0])
        assert set(pinned.backends) == set(order)  # nothing lost for failover
        assert "pinned to" in pinned.reasons[-1]
    assert firsts == {"eagle3"}  # the rule's own pool first, its first decode
    # different requests all go to that decode: hashing over eagle3, ngram and draft would
    # send seeded traffic to whichever method hashes highest, however slow
    spread = {
        pin_seeded(config, decision_for(config, SPECULATIVE), body, f"key-{i}").backends[0]
        for i in range(40)
    }
    assert spread == {"eagle3"}
    # with eagle3 out, the pool's next decode takes it
    assert pin_seeded(config, decision_for(config, ("ngram", "draft")), body, "k").backends[0] == (
        "ngram"
    )
    # the pool's backends are all out: the next pool of the rule (plain) takes it
    only_plain = pin_seeded(config, decision_for(config, ("plain",)), body, "key-1")
    assert only_plain.backends == ("plain",)
    greedy = decision_for(config, SPECULATIVE)
    assert pin_seeded(config, greedy, {"seed": 3, "temperature": 0}, "key-1") is greedy


def test_a_rules_seeded_pool_pins_first() -> None:
    """``seeded_pool: plain`` on the matching rule (code's rule here): seeded sampling
    requests go to plain, whatever the try list's order; the rest of it stays for failover,
    and with plain out the rule's own pool takes them."""
    base = remote_config()
    rules = [
        r.model_copy(update={"seeded_pool": "plain"}) if r.name == "code-rag-speculative" else r
        for r in base.rules
    ]
    config = base.model_copy(update={"rules": rules})
    body = {"seed": 3, "temperature": 0.5}
    order = (*SPECULATIVE, "plain")
    decision = decision_for(config, order)
    assert decision.rule == "code-rag-speculative"
    pinned = pin_seeded(config, decision, body, "key-1")
    assert pinned.backends[0] == "plain" and set(pinned.backends) == set(order)
    assert "pool 'plain'" in pinned.reasons[-1]
    assert pin_seeded(config, decision_for(config, SPECULATIVE), body, "k").backends[0] == (
        "eagle3"
    )


def test_a_seeded_pool_outside_the_rules_pools_is_refused() -> None:
    data = local_config().model_dump(mode="json", exclude_none=True)
    data["rules"][0] = {**data["rules"][0], "pool": "plain", "seeded_pool": "speculative"}
    data["rules"][0]["fallbacks"] = []
    with pytest.raises(ConfigError, match=r"rules\.0\.seeded_pool: .speculative. is not"):
        parse_config(data, "test")


def test_seeded_requests_spread_over_replicas_of_the_same_decode() -> None:
    base = remote_config()
    twin = base.backends["eagle3"].model_copy(update={"url": "http://127.0.0.1:9104"})
    backends = {**base.backends, "eagle3-b": twin}
    pools = {**base.pools, "speculative": ["eagle3", "eagle3-b", "ngram", "draft"]}
    config = base.model_copy(update={"backends": backends, "pools": pools})
    order = ("eagle3", "eagle3-b", "ngram", "draft", "plain")
    body = {"seed": 3, "temperature": 0.5}
    firsts = {
        pin_seeded(config, decision_for(config, order), body, f"key-{i}").backends[0]
        for i in range(40)
    }
    assert firsts == {"eagle3", "eagle3-b"}  # rendezvous hashing over the replicas
    again = {
        pin_seeded(config, decision_for(config, order), body, "key-7").backends[0] for _ in "ab"
    }
    assert len(again) == 1  # the same request, the same replica


@pytest.fixture
async def remote() -> AsyncIterator[InProcess]:
    async with in_process(gateway_settings(), remote_config()) as gateway:
        yield gateway


async def test_seeded_request_keeps_its_backend_while_the_policy_learns(
    remote: InProcess,
) -> None:
    gw = remote
    seeded_body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": CODE}],
        "temperature": 0.5,
        "seed": 42,
        "max_tokens": 16,
    }
    code = {"x-task-type": "code"}
    served = []
    unseeded = []
    for round_ in range(8):
        # other traffic in between: the learner sees each backend's speed change
        for i, name in enumerate(SPECULATIVE):
            gw.fakes[name].delay_s = 0.002 * ((i + round_) % 3)
        for i in range(6):
            body = seeded_body | {
                "seed": None,
                "messages": [{"role": "user", "content": CODE + str(i)}],
            }
            resp = await gw.client.post("/v1/chat/completions", json=body, headers=code)
            unseeded.append(resp.headers["x-specgate-backend"])
        resp = await gw.client.post(
            "/v1/chat/completions", json=seeded_body | {"stream": round_ % 2 == 0}, headers=code
        )
        assert resp.status_code == 200
        served.append(resp.headers["x-specgate-backend"])
    assert len(set(served)) == 1 and served[0] in SPECULATIVE
    explained = (await gw.client.post("/routes/explain", json=seeded_body, headers=code)).json()
    assert explained["backend"] == served[0]
    assert any("pinned to" in r for r in explained["reasons"])
    # its backend down: another, the same every time; back up: the first again
    gw.fakes[served[0]].healthy = False
    await gw.poll()
    moved = {
        (await gw.client.post("/v1/chat/completions", json=seeded_body, headers=code)).headers[
            "x-specgate-backend"
        ]
        for _ in range(3)
    }
    assert len(moved) == 1 and served[0] not in moved
    gw.fakes[served[0]].healthy = True
    await gw.poll()
    resp = await gw.client.post("/v1/chat/completions", json=seeded_body, headers=code)
    assert resp.headers["x-specgate-backend"] == served[0]


def test_a_backend_that_refuses_a_parameter_of_the_request_is_not_pinned() -> None:
    config = remote_config()
    body = {"seed": 3, "temperature": 0.5, "min_p": 0.1}
    firsts = set()
    for i in range(30):
        decision = decision_for(config, (*SPECULATIVE, "plain"))
        refusing = replace(
            decision, features=replace(decision.features, spec_refused={"ngram": ("min_p",)})
        )
        firsts.add(pin_seeded(config, refusing, body, f"key-{i}").backends[0])
    assert firsts == {"eagle3"}
    # ngram first in the pool and refusing: the next decode that accepts the request
    decision = decision_for(config, ("ngram", "draft", "plain"))
    refusing = replace(
        decision, features=replace(decision.features, spec_refused={"ngram": ("min_p",)})
    )
    assert pin_seeded(config, refusing, body, "key-1").backends[0] == "draft"
