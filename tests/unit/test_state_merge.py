"""Merging replicas' adaptive estimates (gateway/state/learning.py): without forgetting, the
merge of two learners equals one learner that saw both streams; the shared learner routes
on the merge and keeps saving only its own observations."""

from __future__ import annotations

import math
import random

import pytest

from gateway.routing.adaptive import ALL, Learner, Observation
from gateway.state.learning import SharedLearner, merge_states


def observations(seed: int, n: int) -> list[Observation]:
    rng = random.Random(seed)
    return [
        Observation(
            "code",
            rng.choice(["greedy/norep", "greedy/rep"]),
            rng.choice(["plain", "ngram"]),
            rng.uniform(5, 50),
            20,
            10,
            rng.randint(0, 10),
            4,
        )
        for _ in range(n)
    ]


def learnt(obs: list[Observation], decay: float = 1.0) -> Learner:
    learner = Learner(decay)
    for o in obs:
        learner.observe(o)
    return learner


@pytest.mark.parametrize("seed", range(5))
def test_without_forgetting_the_merge_is_one_learner_over_both_streams(seed: int) -> None:
    a, b = observations(seed, 40), observations(seed + 100, 25)
    merged = merge_states([learnt(a).groups, learnt(b).groups], 1.0)
    whole = learnt(a + b).groups
    assert merged.keys() == whole.keys()
    for key, group in whole.items():
        assert merged[key].count == group.count
        for name, s in group.backends.items():
            m = merged[key].backends[name]
            assert m.requests == s.requests and m.weight == pytest.approx(s.weight)
            assert m.mean == pytest.approx(s.mean) and m.m2 == pytest.approx(s.m2)
            assert (m.drafts, m.accepted, m.steps) == pytest.approx((s.drafts, s.accepted, s.steps))
            assert (m.tokens, m.seconds) == pytest.approx((s.tokens, s.seconds))
            assert m.speed_tps == pytest.approx(s.speed_tps)


def test_each_side_is_aged_to_its_own_count_before_adding() -> None:
    old = learnt([Observation("code", "greedy/norep", "ngram", 10.0, 20)], decay=0.5)
    for _ in range(3):  # three later observations of plain: ngram's weight is 0.5 ** 3
        old.observe(Observation("code", "greedy/norep", "plain", 40.0, 20))
    peer = learnt([Observation("code", "greedy/norep", "ngram", 40.0, 20)], decay=0.5)
    group = merge_states([old.groups, peer.groups], 0.5)[("code", "greedy/norep")]
    ngram = group.backends["ngram"]
    assert group.count == 5 and ngram.at == 5 and group.factor(ngram, 0.5) == 1.0
    assert ngram.weight == pytest.approx(0.125 + 1.0)
    expected = (0.125 * math.log(10.0) + math.log(40.0)) / 1.125
    assert ngram.mean == pytest.approx(expected)
    assert ngram.speed_tps == pytest.approx((0.125 * 20 + 20) / (0.125 * 2.0 + 0.5))


def test_the_shared_learner_routes_on_the_merge_and_keeps_its_own() -> None:
    peer = learnt(observations(1, 30), decay=0.98)
    own = SharedLearner(0.98)
    assert own.view() == {}
    own.set_peers(peer.groups, peer.observations)
    assert own.view() == peer.groups and own.groups == {}
    extra = Observation("code", "greedy/norep", "ngram", 3.0, 20)
    own.observe(extra)
    assert own.observations == 1 and own.groups.keys() == {
        ("code", "greedy/norep"),
        ("code", ALL),
    }
    both = merge_states([own.groups, peer.groups], 0.98)
    for key in (("code", "greedy/norep"), ("code", ALL)):
        assert own.view()[key] == both[key]
    summary = {(g["task"], g["bucket"]): g for g in own.summary()}
    assert summary[("code", ALL)]["count"] == peer.groups[("code", ALL)].count + 1
