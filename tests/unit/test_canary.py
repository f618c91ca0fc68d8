"""The correctness canary: the divergence verdict on real and constructed vLLM payloads, and
rounds against fake backends (suspect set, routing skips it, recovery, /routes)."""

from __future__ import annotations

import copy
import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.settings import Settings
from gateway.upstream.canary import (
    Canary,
    Generation,
    compare,
    first_divergence,
    parse_completion,
)
from gateway.upstream.state import Backends
from tests.fakes.fake_vllm import FakeBehaviour, create_fake_vllm
from tests.fakes.transport import BackendsTransport
from tests.unit.conftest import MODEL, InProcess, local_config, static_config

#: Real /v1/completions answers (temperature 0, logprobs 2, return_token_ids) of vLLM CPU
#: servers on SmolLM2-135M: float32 plain and draft_model on one prompt (identical), and
#: bfloat16 plain and ngram on one where they diverge at a near-tie.
DATA = json.loads((Path(__file__).parents[1] / "data" / "canary-completions.json").read_text())
MARGIN = 0.5  # the default canary_near_tie_margin


def real(name: str) -> dict[str, Any]:
    return copy.deepcopy(DATA[name])


def with_token(payload: dict[str, Any], pos: int, token_id: int, text: str) -> dict[str, Any]:
    """``payload`` whose generated token ``pos`` is replaced (what a faulty engine emits)."""
    choice = payload["choices"][0]
    choice["token_ids"][pos] = token_id
    choice["logprobs"]["tokens"][pos] = text
    return payload


def gen(ids: list[int], tokens: list[str], top: list[dict[str, float] | None]) -> Generation:
    return Generation(tuple(ids), tuple(tokens), tuple(top))


def test_parse_real_payload() -> None:
    g = parse_completion(DATA["fp32_plain"])
    choice = DATA["fp32_plain"]["choices"][0]
    assert list(g.token_ids) == choice["token_ids"]
    assert g.tokens is not None and "".join(g.tokens[:-1]) == choice["text"]  # last: EOS
    assert g.top is not None and all(step is not None and len(step) == 2 for step in g.top)
    with pytest.raises(ValueError, match="token_ids"):
        parse_completion({"choices": [{"text": "no ids"}]})
    assert parse_completion({"choices": [{"token_ids": [1, 2], "logprobs": None}]}).top is None


@pytest.mark.parametrize(
    ("a", "b", "pos"),
    [
        ([1, 2, 3], [1, 2, 3], None),
        ([1, 2, 3], [1, 5, 3], 1),
        ([1, 2], [1, 2, 3], 2),
        ([], [], None),
    ],
)
def test_first_divergence(a: list[int], b: list[int], pos: int | None) -> None:
    assert first_divergence(a, b) == pos


def test_identical_real_runs_match() -> None:
    plain, spec = parse_completion(DATA["fp32_plain"]), parse_completion(DATA["fp32_draft"])
    assert compare(plain, spec, MARGIN).kind == "matched"


def test_real_bf16_divergence_is_a_near_tie() -> None:
    plain, spec = parse_completion(DATA["bf16_plain"]), parse_completion(DATA["bf16_ngram"])
    verdict = compare(plain, spec, MARGIN)
    assert verdict.kind == "near_tie", verdict
    assert verdict.margin is not None and verdict.margin < MARGIN
    assert (verdict.position, verdict.plain_token, verdict.spec_token) == (16, " man", " m")
    assert verdict.margin == pytest.approx(0.1875)  # a 0.1 threshold would call this a fault


def test_divergence_at_a_confident_token_is_a_fault() -> None:
    plain = DATA["fp32_plain"]
    # position 2: plain "7" (logprob -0.153), runner-up "8" (-3.168): a 3-nat margin
    spec = with_token(real("fp32_plain"), 2, 40, "8")
    verdict = compare(parse_completion(plain), parse_completion(spec), MARGIN)
    assert verdict.kind == "fault"
    assert (verdict.position, verdict.plain_token, verdict.spec_token) == (2, "7", "8")
    assert verdict.margin == pytest.approx(3.015, abs=1e-3)


def test_near_tie_margin_but_token_outside_plain_top2_is_a_fault() -> None:
    plain = gen([1, 2], ["a", "b"], [{"a": -0.1}, {"b": -0.70, "c": -0.72}])
    assert compare(plain, gen([1, 3], ["a", "c"], [None, None]), MARGIN).kind == "near_tie"
    verdict = compare(plain, gen([1, 4], ["a", "d"], [None, None]), MARGIN)
    assert verdict.kind == "fault"
    assert verdict.reason == "speculative token not in the plain top-2"


@pytest.mark.parametrize(
    ("own", "kind"),
    [
        ({"c": -0.70, "b": -0.72}, "near_tie"),  # swapped near-tie in its view too
        ({"c": -0.10, "b": -3.00}, "fault"),  # its own model was sure of the other token
        ({"c": -0.70, "x": -0.72}, "fault"),  # the plain token not even in its top-2
    ],
)
def test_speculative_run_must_see_the_near_tie_too(own: dict[str, float], kind: str) -> None:
    plain = gen([1, 2], ["a", "b"], [{"a": -0.1}, {"b": -0.70, "c": -0.72}])
    spec = gen([1, 3], ["a", "c"], [{"a": -0.1}, own])
    assert compare(plain, spec, MARGIN).kind == kind


def test_unknowable_divergences_are_undecided() -> None:
    near = [{"a": -0.1}, {"b": -0.70, "c": -0.72}]
    no_logprobs = Generation((1, 2))
    assert compare(no_logprobs, Generation((1, 3)), MARGIN).kind == "undecided"
    # the speculative run carried no token texts: membership in the top-2 is unknown
    assert compare(gen([1, 2], ["a", "b"], near), Generation((1, 3)), MARGIN).kind == "undecided"
    # two ids with the same text share one top_logprobs key
    same_text = gen([1, 9], ["a", "b"], [None, None])
    assert compare(gen([1, 2], ["a", "b"], near), same_text, MARGIN).kind == "undecided"
    # the plain run ended where the speculative one went on
    ended = compare(gen([1], ["a"], near[:1]), gen([1, 2], ["a", "b"], near), MARGIN)
    assert (ended.kind, ended.position) == ("undecided", 1)
    # but a confident plain token decides even without the speculative run's texts
    sure = gen([1, 2], ["a", "b"], [{"a": -0.1}, {"b": -0.1, "c": -3.0}])
    assert compare(sure, Generation((1, 3)), MARGIN).kind == "fault"


def canary(gw: InProcess) -> Canary:
    """A canary over the in-process gateway's fakes, shown on its /routes."""
    runtime = gw.app.state.runtime
    made = Canary(
        Backends(runtime.client, lambda: runtime.gateway.config, runtime.gateway.registry),
        interval_s=300,
        near_tie_margin=MARGIN,
        max_tokens=24,
        timeout_s=5,
    )
    gw.app.state.runtime = dataclasses.replace(runtime, canary=made)
    return made


async def routed(gw: InProcess, n: int = 6) -> set[str]:
    """The backends that served ``n`` greedy code requests (the speculative pool's rule)."""
    body = {"model": MODEL, "prompt": "def f():", "max_tokens": 4, "temperature": 0}
    served = set()
    for _ in range(n):
        resp = await gw.client.post("/v1/completions", json=body, headers={"x-task-type": "code"})
        served.add(resp.headers["x-specgate-backend"])
    return served


async def test_fault_marks_suspect_stops_routing_and_recovers(gw: InProcess) -> None:
    gw.app.state.runtime.gateway.reload(static_config())  # the static pools, without learning
    c = canary(gw)
    gw.fakes["plain"].completion_override = real("fp32_plain")
    gw.fakes["draft"].completion_override = real("fp32_draft")
    gw.fakes["eagle3"].completion_override = real("fp32_draft")
    gw.fakes["ngram"].completion_override = with_token(real("fp32_plain"), 2, 40, "8")
    await c.run_round()
    states = gw.app.state.runtime.gateway.registry.states
    assert states["draft"].suspect is None and states["eagle3"].suspect is None
    assert states["ngram"].suspect == (
        "canary: prompt 0 diverged at token 2: plain '7' vs '8', top-2 margin 3.015 nats"
        " (the plain model was sure of its token)"
    )
    body = gw.fakes["ngram"].received[0]["body"]
    sent = json.loads(body)
    assert sent["temperature"] == 0 and sent["logprobs"] == 2 and sent["return_token_ids"]
    assert len(gw.fakes["plain"].received) == 5  # once per prompt, shared by all three backends

    routes = (await gw.client.get("/routes")).json()
    by_name = {b["name"]: b for b in routes["backends"]}
    assert by_name["ngram"]["suspect"] == states["ngram"].suspect
    assert by_name["draft"]["suspect"] is None and by_name["eagle3"]["suspect"] is None
    report = routes["canary"]["backends"]
    assert report["ngram"]["twin"] == "plain"
    assert report["ngram"]["last_round"] == {
        "matched": 0,
        "near_tie": 0,
        "fault": 5,
        "undecided": 0,
    }
    assert report["ngram"]["last_divergence"]["position"] == 2
    assert report["draft"]["last_round"]["matched"] == 5
    assert report["eagle3"]["last_round"]["matched"] == 5
    assert routes["canary"]["rounds"] == 1 and routes["canary"]["last_round"] is not None
    explained = (
        await gw.client.post(
            "/routes/explain", json={"model": MODEL, "prompt": "def f():", "temperature": 0}
        )
    ).json()
    assert routed_why(explained)["ngram"].startswith("suspect: canary: prompt 0")
    assert await routed(gw) == {"draft", "eagle3"}

    gw.fakes["ngram"].completion_override = real("fp32_draft")
    await c.run_round()
    assert states["ngram"].suspect is None
    routes = (await gw.client.get("/routes")).json()
    assert routes["canary"]["backends"]["ngram"]["totals"]["fault"] == 5
    assert routes["canary"]["backends"]["ngram"]["last_round"]["matched"] == 5
    assert await routed(gw, 12) == {"ngram", "draft", "eagle3"}


def routed_why(explained: dict[str, Any]) -> dict[str, str]:
    return {c["backend"]: c["why"] for c in explained["candidates"] if not c["kept"]}


async def test_near_ties_are_recorded_not_suspect(gw: InProcess) -> None:
    c = canary(gw)
    gw.fakes["plain"].completion_override = real("bf16_plain")
    gw.fakes["ngram"].completion_override = real("bf16_ngram")
    gw.fakes["draft"].completion_override = real("bf16_plain")
    gw.app.state.runtime.gateway.registry.states["ngram"].suspect = "canary: an earlier fault"
    await c.run_round()
    assert gw.app.state.runtime.gateway.registry.states["ngram"].suspect is None  # a clean round
    report = c.to_json()["backends"]["ngram"]
    assert report["last_round"]["near_tie"] == 5
    assert report["last_divergence"]["kind"] == "near_tie"


async def test_errors_and_missing_twin_leave_suspicion_unchanged(gw: InProcess) -> None:
    c = canary(gw)
    states = gw.app.state.runtime.gateway.registry.states
    states["ngram"].suspect = states["draft"].suspect = "canary: an earlier fault"
    gw.fakes["plain"].completion_override = real("fp32_plain")
    gw.fakes["draft"].completion_override = real("fp32_draft")
    gw.fakes["ngram"].status = 500
    await c.run_round()
    assert states["ngram"].suspect == "canary: an earlier fault"  # undecided: kept
    assert c.results["ngram"].counts["undecided"] == 5
    assert states["draft"].suspect is None
    gw.fakes["plain"].healthy = False
    await gw.poll()
    await c.run_round()
    assert c.results["ngram"].twin is None
    assert c.results["ngram"].note == f"no healthy plain backend serves {MODEL!r}"


@pytest.mark.parametrize(("interval", "enabled"), [(0.0, False), (3600.0, True)])
async def test_app_starts_the_canary_only_when_enabled(interval: float, enabled: bool) -> None:
    config = local_config()
    fakes = {name: FakeBehaviour(name=name) for name in config.backends}
    apps = {
        b.base_url.removeprefix("http://"): create_fake_vllm(fakes[name])
        for name, b in config.backends.items()
    }
    settings = Settings(health_interval_s=60, canary_interval_s=interval)
    app = create_app(
        settings, config=config, transport=BackendsTransport(apps), rng=random.Random(1)
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            routes = (await client.get("/routes")).json()
    assert (app.state.runtime.canary is not None) is enabled
    assert (routes["canary"] is not None) is enabled
    if enabled:
        assert routes["canary"]["rounds"] == 0  # the first round waits one interval
        assert routes["canary"]["near_tie_margin"] == settings.canary_near_tie_margin


async def test_a_suspect_backend_shows_its_result_while_the_round_goes_on(gw: InProcess) -> None:
    """On a backend's first round the canary's report has its result as soon as its check
    set ``suspect`` (the report used to wait for the round's other backends: ``/routes``
    showed a suspect with no canary result), and removed backends leave the report."""
    gw.app.state.runtime.gateway.reload(static_config())
    c = canary(gw)
    gw.fakes["plain"].completion_override = real("fp32_plain")
    for name in ("draft", "eagle3"):
        gw.fakes[name].completion_override = real("fp32_draft")
    gw.fakes["ngram"].completion_override = with_token(real("fp32_plain"), 2, 40, "8")
    states = gw.app.state.runtime.gateway.registry.states
    seen: list[tuple[str, dict[str, Any]]] = []
    check = c._check

    async def observed(config: Any, name: str, *rest: Any) -> None:
        suspects = [n for n, s in states.items() if s.suspect is not None]
        seen.append((name, {n: c.results[n].to_json()["last_round"] for n in suspects}))
        await check(config, name, *rest)

    c._check = observed  # type: ignore[method-assign]
    await c.run_round()
    first = [name for name, _ in seen].index("ngram")
    assert first < len(seen) - 1  # a backend is checked after ngram
    for _, shown in seen[first + 1 :]:
        assert shown == {"ngram": {"matched": 0, "near_tie": 0, "fault": 5, "undecided": 0}}
    c.results["gone"] = c.results["ngram"]
    await c.run_round()
    assert set(c.results) == {"ngram", "draft", "eagle3"}
