"""The rules table and the routing policy, as plain functions on the shipped local config."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from gateway.config import load_config
from gateway.routing.features import RequestFeatures
from gateway.routing.policy import BackendSnapshot, RoutingPolicy

ROOT = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def policy() -> RoutingPolicy:
    return RoutingPolicy(load_config(ROOT / "config" / "local.yaml"))


def features(task: str, temperature: float | None, model: str = MODEL) -> RequestFeatures:
    t = 1.0 if temperature is None else temperature
    return RequestFeatures(model, t, temperature is not None, task, 1.0, "header")


def all_healthy(**inflight: int) -> dict[str, BackendSnapshot]:
    return {n: BackendSnapshot(True, inflight.get(n, 0)) for n in ("plain", "ngram", "draft")}


@pytest.mark.parametrize(
    ("task", "temperature", "rule", "first_pool"),
    [
        ("code", 0.0, "code-rag-speculative", {"ngram", "draft"}),
        ("code", 0.6, "code-rag-speculative", {"ngram", "draft"}),
        ("rag", 0.2, "code-rag-speculative", {"ngram", "draft"}),
        ("code", 0.7, "default", {"plain"}),
        ("code", 0.8, "hot-plain", {"plain"}),
        ("rag", None, "hot-plain", {"plain"}),  # absent temperature means 1.0
        ("creative", 0.0, "creative-plain", {"plain"}),
        ("creative", 1.0, "creative-plain", {"plain"}),
        ("chat", 0.0, "default", {"plain"}),
        ("chat", 0.7, "default", {"plain"}),
        ("chat", 2.0, "hot-plain", {"plain"}),
    ],
)
def test_rules_table(
    policy: RoutingPolicy, task: str, temperature: float | None, rule: str, first_pool: set[str]
) -> None:
    decision = policy.decide(features(task, temperature), all_healthy(), random.Random(0))
    assert decision.rule == rule
    assert decision.backend in first_pool
    if rule == "code-rag-speculative":
        assert set(decision.backends) == {"ngram", "draft", "plain"}
        assert decision.backends[-1] == "plain"  # the fallback pool comes last


def test_unhealthy_backends_are_skipped_and_fallbacks_follow(policy: RoutingPolicy) -> None:
    state = all_healthy() | {"ngram": BackendSnapshot(False)}
    decision = policy.decide(features("code", 0.0), state, random.Random(0))
    assert decision.backends == ("draft", "plain")
    skipped = {c.backend: c.why for c in decision.candidates if not c.kept}
    assert skipped == {"ngram": "unhealthy"}


def test_least_outstanding_first(policy: RoutingPolicy) -> None:
    decision = policy.decide(features("code", 0.0), all_healthy(ngram=3, draft=1), random.Random(0))
    assert decision.backends == ("draft", "ngram", "plain")


def test_no_healthy_backend_gives_empty_try_list(policy: RoutingPolicy) -> None:
    state = {n: BackendSnapshot(False) for n in ("plain", "ngram", "draft")}
    decision = policy.decide(features("chat", 0.5), state, random.Random(0))
    assert decision.backends == ()
    assert decision.backend is None


def test_other_model_is_not_served_by_these_backends(policy: RoutingPolicy) -> None:
    decision = policy.decide(features("code", 0.0, model="other"), all_healthy(), random.Random(0))
    assert decision.backends == ()
    assert all("serves model" in c.why for c in decision.candidates)


def test_same_state_and_seed_gives_same_decision(policy: RoutingPolicy) -> None:
    a = policy.decide(features("code", 0.1), all_healthy(), random.Random(7))
    b = policy.decide(features("code", 0.1), all_healthy(), random.Random(7))
    assert a == b
