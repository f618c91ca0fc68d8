"""Shared compute and load: backends of one compute group are not spread over, decode speed
is learnt per concurrency band, and measured speeds replace max_batch_for_speculation."""

from __future__ import annotations

import random

from gateway.classify.features import RequestFeatures
from gateway.routing.adaptive import Learner, Observation
from gateway.routing.load import break_even, load_view, measured_at_load
from gateway.routing.policy import BackendSnapshot, RoutingPolicy
from gateway.upstream.state import BackendState
from tests.unit.conftest import MODEL, local_config, static_config

RAG = RequestFeatures(MODEL, 0.0, True, "rag", 1.0, "header")
#: rag decode speeds alone (tokens/s): ngram fastest; eagle3 and draft measured slower, so
#: an unmeasured backend's optimistic prior does not decide these tests
ALONE = {"plain": 15.0, "ngram": 20.0, "eagle3": 12.0, "draft": 6.0}


def busy(**batch: float) -> dict[str, BackendSnapshot]:
    return {
        n: BackendSnapshot(True, inflight=int(batch.get(n, 0)))
        for n in ("plain", "ngram", "draft", "eagle3")
    }


def learnt(
    bucket: str, speeds: dict[str, float], n: int = 20, learner: Learner | None = None
) -> Learner:
    learner = learner or Learner()
    for _ in range(n):
        for backend, speed in speeds.items():
            learner.observe(Observation("rag", bucket, backend, speed, 64))
    return learner


def test_load_view_marks_idle_members_of_a_busy_group() -> None:
    groups = {"plain": "cpu", "ngram": "cpu", "draft": "cpu", "gpu": None}
    view = load_view(groups, {"plain": 3, "gpu": 2})
    assert view.concurrency == {"plain": 3, "ngram": 3, "draft": 3, "gpu": 2}
    assert view.spreads == {"ngram", "draft"}
    assert load_view(groups, {}).spreads == frozenset()  # an idle group spreads nothing


def test_idle_speculative_backend_is_not_spread_to_under_load() -> None:
    """ngram is faster for rag alone, but plain is already computing on the same cores."""
    policy = RoutingPolicy(local_config())
    learner = learnt("greedy/norep", ALONE)
    alone = policy.decide(RAG, busy(), random.Random(0), learner.view())
    assert alone.backends[0] == "ngram" and alone.concurrency == 1
    loaded = [
        policy.decide(RAG, busy(plain=2), random.Random(s), learner.view()) for s in range(20)
    ]
    assert all(d.backends[0] == "plain" for d in loaded)
    assert loaded[0].concurrency == 3
    assert any("shared compute" in r for r in loaded[0].reasons)


def test_static_policy_keeps_load_together_too() -> None:
    policy = RoutingPolicy(static_config())
    decision = policy.decide(RAG, busy(plain=1), random.Random(0))
    assert decision.backends[0] == "plain"
    assert policy.decide(RAG, busy(), random.Random(0)).backends[0] in {"eagle3", "ngram", "draft"}


def test_measured_speeds_at_load_replace_the_configured_batch_limit() -> None:
    policy = RoutingPolicy(local_config())
    state = busy(ngram=6)  # over ngram's max_batch_for_speculation of 4; c4 band (7 requests)
    learner = learnt("greedy/norep", ALONE)
    limited = policy.decide(RAG, state, random.Random(0), learner.view())
    assert limited.backends[0] != "ngram"  # not measured at c8: the configured limit holds
    learnt("greedy/norep/c4", {"plain": 10.0, "ngram": 14.0}, learner=learner)
    assert measured_at_load(
        learner.view(), "rag", {"plain": "greedy/norep/c4", "ngram": "greedy/norep/c4"},
        "ngram", ["plain"], min_weight=3, decay=0.98,
    )  # fmt: skip
    decision = policy.decide(RAG, state, random.Random(0), learner.view())
    assert decision.backends[0] == "ngram"  # measured at c4: speculation still pays there
    report = break_even(learner.view(), ["ngram"], "plain", min_weight=3, decay=0.98)
    assert report["ngram"]["rag"]["bands"] == {"1": 1.333, "4": 1.4}
    assert report["ngram"]["rag"]["stops_paying_at"] is None
    learnt("greedy/norep/c8", {"plain": 10.0, "ngram": 6.0}, learner=learner)
    report = break_even(learner.view(), ["ngram"], "plain", min_weight=3, decay=0.98)
    assert report["ngram"]["rag"]["stops_paying_at"] == 8


def test_a_scrape_older_than_the_last_answer_does_not_count_as_load() -> None:
    """One request at a time: the scrape taken while the last one ran is stale once it
    ended, so the next request is not filed (or penalised) as concurrent."""
    state = BackendState(healthy=True, running=1.0, scraped_at=10.0)
    assert state.snapshot(11.0).batch == 1.0  # scraped after our last answer: trusted
    state.inflight = 1
    state.release()  # our request there ended after that scrape
    assert state.done_at > state.scraped_at
    assert state.snapshot(11.0).batch == 0.0
    state.scraped_at = state.done_at + 1.0  # a newer scrape counts again (other clients)
    assert state.snapshot(11.0).batch == 1.0
