"""``policy: adaptive`` in the routing policy and the app: it reorders only what the matched
rule allows, shows its estimates in ``/routes/explain`` and ``/routes``, and what it learnt
survives a config reload (and, with a state file, a restart)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from contracts.config import ConfigError, GatewayConfig, parse_config
from gateway.classify.features import RequestFeatures
from gateway.routing.adaptive import Learner, Observation
from gateway.routing.policy import BackendSnapshot, RoutingPolicy
from gateway.service import Gateway
from gateway.speculation.prompt_stats import PromptStats, self_overlap
from tests.unit.conftest import MODEL, InProcess, local_config, static_config


def adaptive_config(**routing: Any) -> GatewayConfig:
    data = local_config().model_dump(exclude_none=True)
    data["routing"] |= {"policy": "adaptive"} | routing
    return parse_config(data)


def features(task: str, temperature: float) -> RequestFeatures:
    return RequestFeatures(MODEL, temperature, True, task, 1.0, "header")


def healthy(**batch: float) -> dict[str, BackendSnapshot]:
    return {
        n: BackendSnapshot(True, running=batch.get(n, 0.0))
        for n in ("plain", "ngram", "draft", "eagle3")
    }


def learnt(task: str, bucket: str, speeds: dict[str, float], n: int = 20) -> Learner:
    learner = Learner()
    for _ in range(n):
        for backend, speed in speeds.items():
            learner.observe(Observation(task, bucket, backend, speed, 64))
    return learner


def test_adaptive_puts_the_fastest_allowed_backend_first() -> None:
    policy = RoutingPolicy(adaptive_config())
    learner = learnt(
        "code", "greedy/norep", {"plain": 30.0, "ngram": 20.0, "draft": 9.0, "eagle3": 15.0}
    )
    decision = policy.decide(features("code", 0.0), healthy(), random.Random(0), learner.view())
    assert decision.backends[0] == "plain"  # a plain fallback may win: no guard rail crossed
    assert set(decision.backends) == {"plain", "ngram", "draft", "eagle3"}  # failover order kept
    assert decision.adaptive is not None and decision.adaptive.best == "plain"
    plain = next(e for e in decision.adaptive.estimates if e.backend == "plain")
    assert plain.speed_tps == pytest.approx(30.0) and plain.relative == pytest.approx(1.0)


def test_a_lone_request_goes_for_a_backends_second_answer_and_says_so() -> None:
    """On an idle machine a backend that answered once in the bucket (ngram, slowly) takes
    the next request, and the decision's reasons and ``/routes/explain``'s object name it
    a second answer; once it has two, that is no longer the reason."""
    policy = RoutingPolicy(adaptive_config())
    learner = learnt("code", "greedy/norep", {"plain": 30.0, "eagle3": 25.0, "draft": 9.0}, n=10)
    learner.observe(Observation("code", "greedy/norep", "ngram", 12.0, 64))
    decision = policy.decide(features("code", 0.0), healthy(), random.Random(0), learner.view())
    assert decision.backends[0] == "ngram"
    assert decision.adaptive is not None and decision.adaptive.best == "plain"
    assert decision.adaptive.to_json()["second_answer"] is True
    assert any("its second answer in this bucket" in r for r in decision.reasons)
    learner.observe(Observation("code", "greedy/norep", "ngram", 12.0, 64))
    for seed in range(20):
        again = policy.decide(features("code", 0.0), healthy(), random.Random(seed), learner.view())
        assert again.adaptive is not None and not again.adaptive.second
        assert not any("second answer" in r for r in again.reasons)


def test_rules_stay_the_guard_rails() -> None:
    """creative-plain allows speculative backends only as failover: never first."""
    policy = RoutingPolicy(adaptive_config())
    learner = learnt("creative", "sampled/norep", {"plain": 10.0, "ngram": 50.0})
    for seed in range(20):
        decision = policy.decide(
            features("creative", 1.0), healthy(), random.Random(seed), learner.view()
        )
        assert decision.backends[0] == "plain"


def test_passed_over_backends_are_not_eligible() -> None:
    policy = RoutingPolicy(adaptive_config())
    learner = learnt(
        "code", "greedy/norep", {"plain": 10.0, "ngram": 50.0, "draft": 9.0, "eagle3": 9.0}
    )
    # over max_batch_for_speculation (4): the four share compute_group cpu, whose batch is 9
    state = healthy(ngram=9.0)
    decision = policy.decide(features("code", 0.0), state, random.Random(0), learner.view())
    assert decision.backends[0] == "plain"
    assert {c.backend for c in decision.candidates if not c.kept} >= {"ngram", "eagle3"}


def test_static_policy_ignores_estimates() -> None:
    policy = RoutingPolicy(static_config())
    learner = learnt(
        "code", "greedy/norep", {"plain": 90.0, "ngram": 1.0, "draft": 1.0, "eagle3": 1.0}
    )
    for seed in range(10):
        with_estimates = policy.decide(
            features("code", 0.0), healthy(), random.Random(seed), learner.view()
        )
        without = policy.decide(features("code", 0.0), healthy(), random.Random(seed))
        assert with_estimates == without and without.adaptive is None


def test_rule_policy_overrides_the_default() -> None:
    data = static_config().model_dump(exclude_none=True)
    data["rules"][2]["policy"] = "adaptive"  # code-rag-speculative only
    config = parse_config(data)
    assert config.rules[2].policy == "adaptive" and config.routing.policy == "static"
    learner = learnt(
        "code", "greedy/norep", {"plain": 90.0, "ngram": 1.0, "draft": 1.0, "eagle3": 1.0}
    )
    decision = RoutingPolicy(config).decide(
        features("code", 0.0), healthy(), random.Random(0), learner.view()
    )
    assert decision.backends[0] == "plain"
    data["rules"][2]["policy"] = "sometimes"
    with pytest.raises(ConfigError):
        parse_config(data)


def test_overlap_buckets_requests() -> None:
    policy = RoutingPolicy(adaptive_config())
    learner = learnt(
        "code", "greedy/rep", {"plain": 10.0, "ngram": 40.0, "draft": 5.0, "eagle3": 5.0}
    )
    rep = PromptStats(chars=900, overlap=0.3)
    decision = policy.decide(
        features("code", 0.0), healthy(), random.Random(0), learner.view(), rep
    )
    assert decision.adaptive is not None and decision.adaptive.bucket == "greedy/rep"
    assert decision.backends[0] == "ngram"


def test_self_overlap() -> None:
    assert self_overlap("a b c d e f g h i j k") == 0.0
    assert self_overlap("x = 1\n" * 20) == pytest.approx(1 - 3 / 59)
    assert self_overlap("too short") == 0.0


async def test_explain_and_routes_show_the_estimates(gw: InProcess) -> None:
    gateway: Gateway = gw.app.state.runtime.gateway
    gateway.reload(adaptive_config())
    body = {"model": MODEL, "prompt": "def fib(n):", "max_tokens": 8, "temperature": 0}
    for _ in range(3):  # the fakes answer 8 tokens: enough to learn from
        resp = await gw.client.post("/v1/completions", json=body, headers={"x-task-type": "code"})
        assert resp.status_code == 200
    out = await gw.client.post("/routes/explain", json=body, headers={"x-task-type": "code"})
    adaptive = out.json()["adaptive"]
    assert adaptive["task"] == "code" and adaptive["bucket"] == "greedy/norep"
    assert {e["backend"] for e in adaptive["estimates"]} == {"eagle3", "ngram", "draft", "plain"}
    assert sum(e["requests"] for e in adaptive["estimates"]) == 3
    assert out.json()["backend"] == adaptive["chosen"]
    routes = (await gw.client.get("/routes")).json()["adaptive"]
    assert routes["observations"] == 3 and len(routes["recent"]) == 3
    assert routes["recent"][0]["tokens"] == 8 and routes["recent"][0]["task"] == "code"


async def test_learnt_state_survives_a_reload(gw: InProcess) -> None:
    gateway: Gateway = gw.app.state.runtime.gateway
    body = {"model": MODEL, "prompt": "def f(x):", "max_tokens": 8, "temperature": 0}
    await gw.client.post("/v1/completions", json=body, headers={"x-task-type": "code"})
    learner = gateway.feedback.learner
    assert learner.observations == 1
    gateway.reload(adaptive_config())
    assert gateway.feedback.learner is learner and learner.observations == 1


def test_shipped_config_is_adaptive_on_shared_compute() -> None:
    config = local_config()
    assert config.routing.policy == "adaptive"
    assert {b.compute_group for b in config.backends.values()} == {"cpu"}
