"""A last resort (issue 26, item 2): when every backend of a rule's pools is out, any other
backend that serves the model and can take the request serves it; 503 only when none can.

The bug: a chat request at temperature 0.5 (rule ``default``: pool ``plain``, no fallback)
got 503 ``no_healthy_backend`` while ngram and draft were up and serve the same model.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from contracts.config import load_config, parse_config
from gateway.classify.features import RequestFeatures
from gateway.routing.policy import LAST_RESORT, BackendSnapshot, RoutingPolicy
from gateway.service import Gateway
from tests.unit.conftest import MODEL, InProcess

ROOT = Path(__file__).resolve().parents[2]
REFUSED = {m: ("min_p",) for m in ("ngram", "draft_model", "eagle3")}


@pytest.fixture(scope="module")
def policy() -> RoutingPolicy:
    return RoutingPolicy(load_config(ROOT / "config" / "local.yaml"))


def chat(temperature: float = 0.5, **extra: object) -> RequestFeatures:
    return RequestFeatures(MODEL, temperature, True, "chat", 1.0, "header", **extra)  # type: ignore[arg-type]


def state(**overrides: BackendSnapshot) -> dict[str, BackendSnapshot]:
    base = {n: BackendSnapshot(True) for n in ("plain", "ngram", "draft", "eagle3")}
    return base | overrides


def test_the_issue_case_is_served_by_a_healthy_backend(policy: RoutingPolicy) -> None:
    snaps = state(
        plain=BackendSnapshot(False),
        eagle3=BackendSnapshot(False),
        ngram=BackendSnapshot(True, inflight=2),
    )
    decision = policy.decide(chat(), snaps, random.Random(0))
    assert decision.rule == "default" and decision.pool == "plain"
    assert decision.backends == decision.outside == ("draft", "ngram")  # least outstanding
    assert decision.last_resort == "pool 'plain' out (plain: unhealthy)"
    assert "last resort: pool 'plain' out (plain: unhealthy)" in decision.reasons
    kept = {c.backend: c.why for c in decision.candidates if c.pool == LAST_RESORT and c.kept}
    assert kept == {"draft": "healthy, 0 outstanding", "ngram": "healthy, 2 outstanding"}


def test_only_failover_targets_while_the_rules_pools_can_serve(policy: RoutingPolicy) -> None:
    decision = policy.decide(chat(), state(ngram=BackendSnapshot(False)), random.Random(0))
    assert decision.backends[0] == "plain" and decision.last_resort is None
    assert set(decision.outside) == {"draft", "eagle3"} == set(decision.backends[1:])
    why = {c.backend: c.why for c in decision.candidates if c.pool == LAST_RESORT}
    assert why["draft"] == "healthy, 0 outstanding; failover target after the rule's backends"


@pytest.mark.parametrize(
    ("other", "why"),
    [
        (BackendSnapshot(False), None),
        (BackendSnapshot(True, circuit_open=True), None),
        (BackendSnapshot(True, suspect="diverged at token 3"), None),
    ],
)
def test_a_last_resort_must_itself_be_able_to_serve(
    policy: RoutingPolicy, other: BackendSnapshot, why: str | None
) -> None:
    snaps = {"plain": BackendSnapshot(False), "ngram": other, "draft": other, "eagle3": other}
    decision = policy.decide(chat(), snaps, random.Random(0))
    assert decision.backends == () and decision.last_resort is None


def test_speculation_that_refuses_a_parameter_is_no_last_resort(policy: RoutingPolicy) -> None:
    snaps = state(plain=BackendSnapshot(False))
    decision = policy.decide(chat(spec_refused=REFUSED), snaps, random.Random(0))
    assert decision.backends == ()  # min_p: every speculative backend answers 400
    refused = {c.backend: c.why for c in decision.candidates if c.pool == LAST_RESORT}
    assert refused["ngram"] == "ngram speculation refuses min_p"
    assert not any(c.kept for c in decision.candidates)


def test_plain_backends_go_first_and_the_reason_names_every_pool() -> None:
    cfg = parse_config(
        {
            "defaults": {"pool": "spec"},
            "backends": {
                "s1": {
                    "url": "http://s1:1",
                    "model": MODEL,
                    "speculation": {"method": "ngram", "num_speculative_tokens": 3},
                },
                "s2": {
                    "url": "http://s2:1",
                    "model": MODEL,
                    "speculation": {"method": "ngram", "num_speculative_tokens": 3},
                },
                "p1": {"url": "http://p1:1", "model": MODEL},
                "other": {"url": "http://o:1", "model": "other-model"},
            },
            "pools": {"spec": ["s1"], "fb": ["s2"]},
            "rules": [
                {"name": "r", "match": {"tasks": ["chat"]}, "pool": "spec", "fallbacks": ["fb"]}
            ],
        }
    )
    snaps = {
        "s1": BackendSnapshot(True, circuit_open=True),
        "s2": BackendSnapshot(False),
        "p1": BackendSnapshot(True, inflight=5),
        "other": BackendSnapshot(True),
    }
    decision = RoutingPolicy(cfg).decide(chat(), snaps, random.Random(0))
    assert decision.backends == ("p1",)  # never the backend of another model
    assert decision.last_resort == "pools 'spec', 'fb' out (s1: circuit open, s2: unhealthy)"


def test_guards_remove_a_last_resort_and_leave_a_503_not_a_400() -> None:
    cfg = parse_config(
        {
            "defaults": {"pool": "p"},
            "guards": {"bug": {"why": "dies", "match": {"fields": ["seed"]}, "action": "refuse"}},
            "backends": {
                "a": {"url": "http://a:1", "model": MODEL},
                "b": {"url": "http://b:1", "model": MODEL, "guards": ["bug"]},
                "c": {"url": "http://c:1", "model": MODEL},
            },
            "pools": {"p": ["a"]},
        }
    )
    gateway = Gateway(cfg, random.Random(0))
    gateway.registry.states["a"].healthy = False
    decision = gateway.decide(chat())
    assert set(decision.backends) == {"b", "c"}
    assert gateway.guard(decision, {"seed": 1}).backends == ("c",)
    gateway.registry.states["c"].healthy = False
    decision = gateway.decide(chat())
    assert gateway.guard(decision, {"seed": 1}).backends == ()  # the caller's 503
    assert gateway.guard(decision, {}).backends == ("b",)
    assert gateway.stats.guarded["bug"] == 2


CHAT = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Hello there"}],
    "max_tokens": 4,
    "temperature": 0.5,
}


async def test_served_with_the_reason_in_headers_explain_and_counts(gw: InProcess) -> None:
    gw.fakes["plain"].healthy = gw.fakes["eagle3"].healthy = False
    await gw.poll()
    headers = {"x-task-type": "chat"}
    for stream in (False, True):
        resp = await gw.client.post(
            "/v1/chat/completions", json=CHAT | {"stream": stream}, headers=headers
        )
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-specgate-rule"] == "default"
        assert resp.headers["x-specgate-backend"] in {"ngram", "draft"}
        assert resp.headers["x-specgate-last-resort"] == "pool 'plain' out (plain: unhealthy)"
    explained = (await gw.client.post("/routes/explain", json=CHAT, headers=headers)).json()
    assert explained["last_resort"] == "pool 'plain' out (plain: unhealthy)"
    assert explained["backend"] in {"ngram", "draft"}
    decisions = (await gw.client.get("/routes")).json()["decisions"]
    assert decisions["last_resort"] == 2 and decisions["rejected"] == 0
    metrics = gw.app.state.runtime.metrics.registry
    assert metrics.get_sample_value("specgate_last_resort_total") == 2.0

    # a parameter every speculation method refuses: no last resort, the 503 envelope
    resp = await gw.client.post("/v1/chat/completions", json=CHAT | {"min_p": 0.1}, headers=headers)
    assert resp.status_code == 503
    assert resp.json()["error"]["code"] == "no_healthy_backend"

    gw.fakes["plain"].healthy = True
    await gw.poll()
    resp = await gw.client.post("/v1/chat/completions", json=CHAT, headers=headers)
    assert resp.headers["x-specgate-backend"] == "plain"
    assert "x-specgate-last-resort" not in resp.headers


async def test_a_rule_backend_failing_before_its_answer_fails_over_outside(gw: InProcess) -> None:
    """Up by its probes but answering 503 (or refusing, timing out at connect): the request
    goes on to a backend outside the rule's pools rather than getting a 503."""
    gw.fakes["plain"].status = 503
    headers = {"x-task-type": "chat"}
    resp = await gw.client.post("/v1/chat/completions", json=CHAT, headers=headers)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-specgate-rule"] == "default"
    assert resp.headers["x-specgate-backend"] in {"ngram", "draft", "eagle3"}
    assert resp.headers["x-specgate-last-resort"] == "failover: the rule's backends did not answer"
    decisions = (await gw.client.get("/routes")).json()["decisions"]
    assert decisions["last_resort"] == 1 and decisions["failovers"] == 1
