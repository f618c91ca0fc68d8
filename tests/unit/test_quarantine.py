"""The quarantine table and fingerprints (pure), table-driven."""

from __future__ import annotations

import pytest

from gateway.upstream.quarantine import VOLATILE_FIELDS, QuarantineTable, fingerprint

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "seed": 1}
CHAT = "/v1/chat/completions"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def table(clock: Clock, **kw: float) -> QuarantineTable:
    args = {"ttl_s": 60.0, "max_entries": 100, "strikes": 2} | kw
    return QuarantineTable(
        ttl_s=args["ttl_s"],
        max_entries=int(args["max_entries"]),
        strikes=int(args["strikes"]),
        clock=clock,
    )


@pytest.mark.parametrize(
    "change",
    [
        {"stream": True},
        {"stream": True, "stream_options": {"include_usage": True}},
        {"user": "alice"},
        {"request_id": "r-2"},
        {"metadata": {"k": "v"}},
    ],
)
def test_volatile_fields_do_not_change_the_fingerprint(change: dict[str, object]) -> None:
    assert set(change) <= VOLATILE_FIELDS
    assert fingerprint(CHAT, BODY | change) == fingerprint(CHAT, BODY)


@pytest.mark.parametrize(
    "change", [{"seed": 2}, {"n": 2}, {"max_tokens": 5}, {"temperature": 0.5}, {"model": "x"}]
)
def test_what_the_engine_computes_changes_the_fingerprint(change: dict[str, object]) -> None:
    assert fingerprint(CHAT, BODY | change) != fingerprint(CHAT, BODY)


def test_fingerprint_is_a_hash_of_endpoint_and_body_never_the_text() -> None:
    fp = fingerprint(CHAT, BODY)
    assert len(fp) == 32 and int(fp, 16) >= 0
    assert fingerprint("/v1/completions", BODY) != fp
    assert fingerprint(CHAT, dict(reversed(BODY.items()))) == fp  # key order does not matter
    assert fingerprint(CHAT, BODY | {"x": "\ud800"})  # lone surrogates hash too


def test_a_death_with_one_request_in_flight_quarantines_it() -> None:
    clock = Clock()
    t = table(clock)
    assert not t.blocking
    [entry] = t.record([("fp1", CHAT)], "plain", "HTTP 500: EngineDeadError")
    assert entry.fingerprint == "fp1" and t.blocking
    assert t.check("fp1") is entry and entry.refused == 1
    assert t.check("other") is None
    clock.now += 61
    assert t.check("fp1") is None  # expired and forgotten
    assert not t.blocking and t.entries() == []


def test_several_in_flight_are_suspects_until_a_second_death() -> None:
    clock = Clock()
    t = table(clock)
    assert t.record([("a", CHAT), ("b", CHAT), ("c", CHAT)], "plain", "dropped") == []
    assert t.counts() == (0, 3)
    assert t.check("a") is None  # a suspect is still served
    clock.now += 30
    [entry] = t.record([("a", CHAT), ("d", CHAT)], "ngram", "dropped")
    assert entry.fingerprint == "a" and entry.strikes == 2
    assert [d.backend for d in entry.deaths] == ["plain", "ngram"]
    assert t.counts() == (1, 3)
    clock.now += 31  # b and c: 61 s after their strike, forgotten; a quarantined until +60
    assert t.counts() == (1, 1)


def test_strikes_1_quarantines_every_participant() -> None:
    t = table(Clock(), strikes=1)
    assert len(t.record([("a", CHAT), ("b", CHAT)], "plain", "dropped")) == 2


def test_ttl_0_counts_but_never_refuses() -> None:
    t = table(Clock(), ttl_s=0)
    assert t.record([("a", CHAT)], "plain", "dropped") == []
    assert not t.blocking and t.check("a") is None


def test_the_table_is_bounded_oldest_strike_evicted_first() -> None:
    clock = Clock()
    t = table(clock, max_entries=3)
    for i in range(5):
        clock.now += 1
        t.record([(f"fp{i}", CHAT)], "plain", "dropped")
    assert [e.fingerprint for e in t.entries()] == ["fp4", "fp3", "fp2"]
    assert t.counts() == (3, 0) and t.quarantined_total == 5


def test_clear_one_or_all() -> None:
    t = table(Clock())
    t.record([("a", CHAT)], "plain", "x")
    t.record([("b", CHAT)], "plain", "x")
    assert t.clear("a") == 1 and t.clear("a") == 0
    assert t.check("a") is None and t.check("b") is not None
    assert t.clear() == 1 and not t.blocking


def test_admin_view_has_no_request_content() -> None:
    clock = Clock()
    t = table(clock)
    t.record([(fingerprint(CHAT, BODY), CHAT)], "plain", "HTTP 500: EngineDeadError")
    clock.now += 5
    view = t.to_json()
    [entry] = view["entries"]
    assert entry["state"] == "quarantined" and entry["expires_in_s"] == 55.0
    assert entry["deaths"] == [
        {"backend": "plain", "signal": "HTTP 500: EngineDeadError", "ago_s": 5.0, "in_flight": 1}
    ]
    assert "hi" not in str(view)


@pytest.mark.parametrize(
    ("participants", "confirmed", "quarantined", "suspects"),
    [
        (["a"], True, 1, 0),  # the engine said it died, one request there: the culprit
        (["a", "b", "c"], True, 0, 3),  # engine error, several: a strike each
        (["a", "a", "a"], True, 0, 1),  # identical requests: one suspect, not "alone"
        (["a"], False, 0, 1),  # the process vanished under one request: a strike
        (["a", "b", "c"], False, 0, 0),  # vanished under several: killed from outside
    ],
)
def test_who_a_death_blames(
    participants: list[str], confirmed: bool, quarantined: int, suspects: int
) -> None:
    t = table(Clock())
    t.record([(fp, CHAT) for fp in participants], "plain", "x", confirmed=confirmed)
    assert t.counts() == (quarantined, suspects)


def test_the_same_death_recorded_again_strikes_once() -> None:
    clock = Clock()
    t = table(clock)
    t.record([("a", CHAT), ("b", CHAT)], "plain", "dropped", confirmed=True, at=clock.now)
    clock.now += 1
    t.record([("a", CHAT), ("b", CHAT)], "plain", "HTTP 500", confirmed=True, at=clock.now - 1)
    assert [e.strikes for e in t.entries()] == [1, 1] and t.counts() == (0, 2)
