"""The rules table and the routing policy, as plain functions on the shipped local config."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.config import load_config
from contracts.tasks import TASKS
from gateway.classify.features import RequestFeatures
from gateway.routing.policy import BackendSnapshot, RoutingPolicy

ROOT = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-instruct"
BACKENDS = ("plain", "ngram", "draft", "eagle3")  # config/local.yaml's
SPECULATIVE = {"eagle3", "ngram", "draft"}


@pytest.fixture(scope="module")
def policy() -> RoutingPolicy:
    return RoutingPolicy(load_config(ROOT / "config" / "local.yaml"))


def features(task: str, temperature: float | None, model: str = MODEL) -> RequestFeatures:
    t = 1.0 if temperature is None else temperature
    return RequestFeatures(model, t, temperature is not None, task, 1.0, "header")


def all_healthy(**inflight: int) -> dict[str, BackendSnapshot]:
    return {n: BackendSnapshot(True, inflight=inflight.get(n, 0)) for n in BACKENDS}


@pytest.mark.parametrize(
    ("task", "temperature", "rule", "first_pool"),
    [
        ("code", 0.0, "code-rag-speculative", SPECULATIVE),
        ("code", 0.6, "code-rag-speculative", SPECULATIVE),
        ("rag", 0.2, "code-rag-speculative", SPECULATIVE),
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
        assert set(decision.backends) == SPECULATIVE | {"plain"}
        assert decision.backends[-1] == "plain"  # the fallback pool comes last


def test_unhealthy_backends_are_skipped_and_fallbacks_follow(policy: RoutingPolicy) -> None:
    state = all_healthy() | {"ngram": BackendSnapshot(False), "eagle3": BackendSnapshot(False)}
    decision = policy.decide(features("code", 0.0), state, random.Random(0))
    assert decision.backends == ("draft", "plain")
    skipped = {c.backend: c.why for c in decision.candidates if not c.kept}
    assert skipped == {"ngram": "unhealthy", "eagle3": "unhealthy"}


def test_least_outstanding_first() -> None:
    config = load_config(ROOT / "config" / "local.yaml")
    own = {n: b.model_copy(update={"compute_group": None}) for n, b in config.backends.items()}
    policy = RoutingPolicy(config.model_copy(update={"backends": own}))  # no shared compute
    state = all_healthy(ngram=3, draft=1, eagle3=2)
    decision = policy.decide(features("code", 0.0), state, random.Random(0))
    assert decision.backends == ("draft", "eagle3", "ngram", "plain")


def test_no_healthy_backend_gives_empty_try_list(policy: RoutingPolicy) -> None:
    state = {n: BackendSnapshot(False) for n in BACKENDS}
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


def test_loaded_speculative_backend_is_passed_over_for_plain(policy: RoutingPolicy) -> None:
    state = all_healthy() | {
        "ngram": BackendSnapshot(True, running=3, waiting=2),
        "eagle3": BackendSnapshot(True, running=1),
    }
    decision = policy.decide(features("code", 0.0), state, random.Random(0))
    # all four share compute_group cpu: its batch (6, other clients' requests) is over every
    # speculative backend's max_batch_for_speculation of 4, so plain goes first and they stay
    # failover targets (a burst of this gateway's own gets some slack: test_shared_compute)
    assert decision.backends[0] == "plain"
    [ngram] = [c for c in decision.candidates if c.backend == "ngram"]
    assert not ngram.kept
    assert ngram.why == "batch 6 > max_batch_for_speculation 4: speculation loses"
    calm = all_healthy(eagle3=1, ngram=1)  # a batch of 2: eagle3 first, with the load
    together = policy.decide(features("code", 0.0), calm, random.Random(0))
    assert together.backends[0] in {"eagle3", "ngram"}
    assert any(r.startswith("shared compute:") for r in together.reasons) or (
        together.backends[0] == "eagle3"
    )


def test_gateway_inflight_counts_as_load_before_the_scrape_sees_it(policy: RoutingPolicy) -> None:
    state = all_healthy() | {
        "ngram": BackendSnapshot(True, inflight=5),
        "draft": BackendSnapshot(True, inflight=5),
        "eagle3": BackendSnapshot(True, inflight=5),
    }
    decision = policy.decide(features("rag", 0.1), state, random.Random(0))
    assert decision.backends[0] == "plain"


def test_demoted_backend_loses_traffic_but_keeps_a_probe_share(policy: RoutingPolicy) -> None:
    state = all_healthy() | {"draft": BackendSnapshot(True, demoted=True, acceptance_rate=0.01)}
    rng = random.Random(3)
    decisions = [policy.decide(features("code", 0.0), state, rng) for _ in range(2000)]
    kept = [any(c.backend == "draft" and c.kept for c in d.candidates) for d in decisions]
    assert 0.03 < kept.count(True) / len(kept) < 0.07  # its probe_share of 0.05
    share = [d.backend for d in decisions].count("draft") / len(decisions)
    assert 0.005 < share < 0.03  # kept, it ties with ngram and eagle3: first a third of that
    decision = policy.decide(features("code", 0.0), state, random.Random(0))
    [draft] = [c for c in decision.candidates if c.backend == "draft"]
    if not draft.kept:
        assert draft.why == "demoted: acceptance rate 0.01 < min_acceptance_rate 0.5"
        assert decision.backends[-1] == "draft"


def test_all_speculative_passed_over_adds_plain_even_without_fallback() -> None:
    config = load_config(ROOT / "config" / "local.yaml")
    config.rules[2].fallbacks = []
    policy = RoutingPolicy(config)
    state = {
        "plain": BackendSnapshot(True),
        "ngram": BackendSnapshot(True, running=9),
        "draft": BackendSnapshot(True, running=9),
        "eagle3": BackendSnapshot(True, running=9),
    }
    decision = policy.decide(features("code", 0.0), state, random.Random(0))
    assert decision.backends[0] == "plain"
    assert set(decision.backends[1:]) == SPECULATIVE


snapshots = st.builds(
    BackendSnapshot,
    healthy=st.booleans(),
    inflight=st.integers(0, 50),
    running=st.floats(0, 50),
    waiting=st.floats(0, 50),
    demoted=st.booleans(),
    acceptance_rate=st.none() | st.floats(0, 1),
)


@given(
    task=st.sampled_from(TASKS),
    temperature=st.none() | st.floats(0, 2),
    state=st.fixed_dictionaries({n: snapshots for n in BACKENDS}),
    seed=st.integers(0, 2**32),
    model=st.sampled_from([MODEL, "other"]),
)
def test_policy_properties(
    policy: RoutingPolicy,
    task: str,
    temperature: float | None,
    state: dict,
    seed: int,
    model: str,
) -> None:
    f = features(task, temperature, model)
    decision = policy.decide(f, state, random.Random(seed))
    # never an unhealthy or unknown backend, never one twice, always the model's backends
    assert all(state[b].healthy for b in decision.backends)
    assert len(set(decision.backends)) == len(decision.backends)
    if model != MODEL:
        assert decision.backends == ()
    else:  # a healthy backend in the decided pools gets the request, else any healthy one
        rule = next((r for r in policy.config.rules if r.name == decision.rule), None)
        pools = [rule.pool, *rule.fallbacks] if rule else [policy.config.defaults.pool]
        allowed = {b for p in pools for b in policy.config.pools[p]}
        in_pools = any(state[b].healthy for b in allowed)
        assert bool(decision.backends) == any(s.healthy for s in state.values())
        assert (decision.last_resort is not None) == (bool(decision.backends) and not in_pools)
        if decision.last_resort is not None:  # plain backends first
            spec = [policy.config.backends[b].spec.speculative for b in decision.backends]
            assert spec == sorted(spec)
    # deterministic for a given state and seed
    assert decision == policy.decide(f, state, random.Random(seed))


def test_suspect_backend_is_never_routed(policy: RoutingPolicy) -> None:
    state = all_healthy() | {"ngram": BackendSnapshot(True, suspect="diverged at token 7")}
    decision = policy.decide(features("code", 0.0), state, random.Random(0))
    assert "ngram" not in decision.backends
    [ngram] = [c for c in decision.candidates if c.backend == "ngram"]
    assert ngram.why == "suspect: diverged at token 7"
