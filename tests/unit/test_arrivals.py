"""Requests arriving together are routed as their burst (gateway.arrivals): a wave's first
request meets idle servers, yet is routed for the wave, so the wave stays on one server."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace
from typing import Any

import pytest

from bench.sim.fleet import fleet_config
from bench.sim.server import MODEL as SIM_MODEL
from contracts.config import parse_config
from gateway import arrivals as arrivals_module
from gateway.arrivals import QUIET_TURNS, Arrivals
from gateway.classify.features import RequestFeatures
from gateway.routing.adaptive import Learner, Observation
from gateway.routing.adaptive_choice import COHORT_KINDS
from gateway.routing.policy import BackendSnapshot, CohortMember, RoutingPolicy
from tests.unit.conftest import (
    MODEL,
    InProcess,
    gateway_settings,
    in_process,
    local_config,
    static_config,
)

CODE = RequestFeatures(MODEL, 0.0, True, "code", 1.0, "header")
BODY = {"model": MODEL, "prompt": "def add(a, b):", "temperature": 0, "max_tokens": 8}
SPECULATIVE = {"eagle3", "ngram", "draft"}


def idle() -> dict[str, BackendSnapshot]:
    return {n: BackendSnapshot(True) for n in ("plain", "ngram", "draft", "eagle3")}


# -- the policy: arrivals are load ------------------------------------------------------------


def test_a_burst_arriving_at_idle_servers_is_routed_for_its_size() -> None:
    """Code at temperature 0 on an idle machine goes to a speculative backend alone and with
    three others arriving (a batch of 4, at max_batch_for_speculation), to plain with eight."""
    policy = RoutingPolicy(static_config())
    alone = policy.decide(CODE, idle(), random.Random(0))
    assert alone.backends[0] in SPECULATIVE and alone.concurrency == 1
    four = policy.decide(CODE, idle(), random.Random(0), arriving=3)
    assert four.backends[0] in SPECULATIVE and four.concurrency == 4
    nine = policy.decide(CODE, idle(), random.Random(0), arriving=8)
    assert nine.backends[0] == "plain" and nine.concurrency == 9
    why = " / ".join(nine.reasons)
    assert "arriving together: 8 more request(s) of the model, 8 per compute unit" in why
    assert "batch 8 > max_batch_for_speculation 4: speculation loses" in why


def test_arrivals_are_shared_over_the_compute_units_serving_the_model() -> None:
    """Eight simulated GPUs (plain and EAGLE-3 on each): 40 requests arriving are 5 a GPU."""
    names = {f"{k}-g{g}": k for g in range(8) for k in ("plain", "eagle3")}
    urls = {n: f"http://127.0.0.1:{9000 + i}" for i, n in enumerate(names)}
    config = parse_config(fleet_config(names, urls, groups=True))
    policy = RoutingPolicy(config)
    assert policy.units[SIM_MODEL] == 8
    assert policy.cohort_cap(SIM_MODEL) == 8 * 4 * 2 + 2
    features = RequestFeatures(SIM_MODEL, 0.0, True, "code", 1.0, "header")
    state = {n: BackendSnapshot(True) for n in config.backends}
    decision = policy.decide(features, state, random.Random(0), arriving=40)
    assert decision.concurrency == 6  # 5 arriving + itself
    assert "40 more request(s) of the model, 5 per compute unit" in " ".join(decision.reasons)
    # seven GPUs down: the burst can only go to the last one, and is routed for all of it
    down = state | {n: BackendSnapshot(False) for n in config.backends if not n.endswith("-g0")}
    last = policy.decide(features, down, random.Random(0), arriving=23)
    assert last.backends[0] == "plain-g0" and last.concurrency == 24


def test_the_cap_of_a_cohort_is_where_every_speculative_backend_is_passed_over() -> None:
    """A cohort of the cap's size has its first request see more than twice every limit
    beside it: every speculative backend passed over, whatever was learnt (one fewer, and
    learnt speeds could still send the cohort to one while its tail went elsewhere)."""
    policy = RoutingPolicy(local_config())  # one compute group, limits of 4
    assert policy.cohort_cap(MODEL) == 4 * 2 + 2
    code = RequestFeatures(MODEL, 0.0, True, "code", 1.0, "header")
    state = {n: BackendSnapshot(True) for n in policy.config.backends}
    capped = policy.decide(code, state, random.Random(0), arriving=policy.cohort_cap(MODEL) - 1)
    assert capped.backends[0] == "plain" and capped.concurrency == 10
    assert policy.cohort_cap("another-model") == 1  # not served: no cohort
    plain_only = local_config().model_copy(
        update={"backends": {"plain": local_config().backends["plain"]}}
    )
    assert RoutingPolicy(plain_only).cohort_cap(MODEL) == 1  # nothing to decide between


# -- the cohort's first request is chosen for the cohort's mix of tasks ------------------------

#: Learnt speeds at a batch of 4 on one simulated GPU (tokens/s): EAGLE-3 is code's fastest by
#: far, plain every other task's; for a wave of one request of each task plain is faster
#: (835 against 770 summed), as on the simulator's H200 profile a whole wave was.
WAVE_SPEEDS = {
    ("code", "greedy/norep/c4"): {"eagle3-g0": 300.0, "plain-g0": 200.0},
    ("rag", "greedy/norep/c4"): {"eagle3-g0": 190.0, "plain-g0": 210.0},
    ("chat", "sampled/norep/c4"): {"eagle3-g0": 150.0, "plain-g0": 210.0},
    ("creative", "sampled/norep/c4"): {"eagle3-g0": 130.0, "plain-g0": 215.0},
}


def one_gpu() -> RoutingPolicy:
    names = {"plain-g0": "plain", "eagle3-g0": "eagle3"}
    urls = {n: f"http://127.0.0.1:{9000 + i}" for i, n in enumerate(names)}
    return RoutingPolicy(parse_config(fleet_config(names, urls, groups=True)))


def wave_learner() -> Learner:
    learner = Learner()
    for _ in range(20):
        for (task, bucket), speeds in WAVE_SPEEDS.items():
            for backend, speed in speeds.items():
                learner.observe(Observation(task, bucket, backend, speed, 64))
    return learner


def member(task: str) -> CohortMember:
    temperature = 0.0 if task in ("code", "rag") else 0.7
    return CohortMember(RequestFeatures(SIM_MODEL, temperature, True, task, 1.0, "header"), None)


def test_a_cohort_goes_where_its_mix_of_tasks_is_fastest() -> None:
    """A code request leading a wave of code, rag, chat and creative: alone (or leading three
    code requests) it goes to EAGLE-3, code's fastest; for the mixed wave, to plain, which
    the four together run faster. The decision says so, and explain shows the mix."""
    policy, estimates = one_gpu(), wave_learner().view()
    state = {n: BackendSnapshot(True) for n in ("plain-g0", "eagle3-g0")}
    code = member("code").features
    mixed = [member(t) for t in ("rag", "chat", "creative")]
    for seed in range(20):
        alone = policy.decide(code, state, random.Random(seed), estimates, arriving=3)
        assert alone.backends[0] == "eagle3-g0"
        coders = [member("code")] * 3
        same = policy.decide(code, state, random.Random(seed), estimates, None, 3, coders)
        assert same.backends[0] == "eagle3-g0"
        wave = policy.decide(code, state, random.Random(seed), estimates, None, 3, mixed)
        assert wave.backends[0] == "plain-g0", seed
    assert wave.adaptive is not None and wave.adaptive.best == "plain-g0"
    assert wave.adaptive.cohort == {"code": 1, "rag": 1, "chat": 1, "creative": 1}
    assert wave.adaptive.to_json()["cohort"] == {"code": 1, "rag": 1, "chat": 1, "creative": 1}
    assert "for the 4 requests arriving together (chat 1, code 1, creative 1, rag 1)" in " ".join(
        wave.reasons
    )
    # its own estimates are the first request's (code's): EAGLE-3 the faster for it alone
    own = {e.backend: e.speed_tps for e in wave.adaptive.estimates}
    assert own["eagle3-g0"] == pytest.approx(300.0) and own["plain-g0"] == pytest.approx(200.0)


def test_a_cohort_reads_only_tasks_something_was_measured_for() -> None:
    """Members of a task no backend was measured for cannot tell the candidates apart: the
    choice is the first request's own. On a busy compute the cohort is not read (the first
    request joins the busiest, as any request there)."""
    policy, estimates = one_gpu(), wave_learner().view()
    state = {n: BackendSnapshot(True) for n in ("plain-g0", "eagle3-g0")}
    code = member("code").features
    unknown = [member("summarise")] * 3
    for seed in range(10):
        decision = policy.decide(code, state, random.Random(seed), estimates, None, 3, unknown)
        assert decision.backends[0] == "eagle3-g0"
    busy = state | {"eagle3-g0": BackendSnapshot(True, inflight=2)}
    mixed = [member(t) for t in ("rag", "chat", "creative")]
    decision = policy.decide(code, busy, random.Random(0), estimates, None, 1, mixed)
    assert decision.adaptive is not None and not decision.adaptive.cohort


# -- the cohort: who waits, and how long --------------------------------------------------------


async def turns_during(coro: Any) -> int:
    """The event-loop turns ``coro`` took (a ticker counts one a turn)."""
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0)
            ticks += 1

    tick = asyncio.ensure_future(ticker())
    await asyncio.sleep(0)
    ticks = 0
    await coro
    tick.cancel()
    return ticks


async def test_a_lone_request_waits_a_few_loop_turns_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing on the clock: QUIET_TURNS turns without an arrival, and it goes; a cohort of
    one is not counted. (The 10 ms bound is lifted: a loaded machine's pause between two
    turns must not end the forming early here.)"""
    monkeypatch.setattr(arrivals_module, "MAX_FORMING_S", 5.0)
    arrivals = Arrivals()
    with arrivals.enter(MODEL, object()):
        assert await turns_during(arrivals.settle(MODEL, 9)) == QUIET_TURNS
        assert arrivals.arriving(MODEL) == 1
    assert arrivals.arriving(MODEL) == 0 and arrivals.entered == {}
    assert arrivals.cohorts == {} and arrivals.forming == {}


async def test_requests_arriving_while_a_cohort_forms_see_each_other() -> None:
    """Twelve requests start one after the other in the same loop turn (as a wave the kernel
    holds is read): the first forms the cohort, the rest wait for it, and each is routed
    seeing those not routed yet, the first all twelve."""
    arrivals, seen = Arrivals(), []

    async def request(n: int) -> None:
        with arrivals.enter(MODEL, object()):
            await arrivals.settle(MODEL, cap=64)
            seen.append((n, arrivals.arriving(MODEL)))

    await asyncio.gather(*(request(n) for n in range(12)))
    assert seen[0] == (0, 12)
    assert [a for _, a in seen] == list(range(12, 0, -1))
    assert arrivals.cohorts == {"formed": 1, "requests": 12}


async def test_two_models_form_their_own_cohorts() -> None:
    arrivals, seen = Arrivals(), {}

    async def request(model: str, n: int) -> None:
        with arrivals.enter(model, object()):
            await arrivals.settle(model, cap=64)
            seen.setdefault(model, []).append(arrivals.arriving(model))

    await asyncio.gather(*(request(m, n) for n in range(3) for m in ("a", "b")))
    assert seen == {"a": [3, 2, 1], "b": [3, 2, 1]}
    assert arrivals.cohorts == {"formed": 2, "requests": 6}


async def test_forming_ends_at_the_cap_and_the_others_go_on() -> None:
    """With a cap of 3, a cohort stops forming once three entered; later arrivals (one a loop
    turn here) are routed as they come, seeing the load then."""
    arrivals, order = Arrivals(), []

    async def request(n: int, delay_turns: int) -> None:
        for _ in range(delay_turns):
            await asyncio.sleep(0)
        with arrivals.enter(MODEL, object()):
            if n == 0 or MODEL in arrivals.forming:  # as prepare_routed: idle, or forming
                await arrivals.settle(MODEL, cap=3)
            order.append(n)

    await asyncio.gather(*(request(n, n) for n in range(6)))
    assert order[0] == 0 and sorted(order) == list(range(6))
    assert arrivals.cohorts["requests"] == 3


async def test_a_cancelled_first_request_releases_the_cohort() -> None:
    arrivals = Arrivals()

    async def request() -> int:
        with arrivals.enter(MODEL, object()):
            await arrivals.settle(MODEL, 64)
            return arrivals.arriving(MODEL)

    first = asyncio.ensure_future(request())
    await asyncio.sleep(0)  # it is forming
    second, third = asyncio.ensure_future(request()), asyncio.ensure_future(request())
    await asyncio.sleep(0)
    assert arrivals.arriving(MODEL) == 3
    first.cancel()
    third.cancel()  # a follower's client gone too
    for gone in (first, third):
        with pytest.raises(asyncio.CancelledError):
            await gone
    assert await asyncio.wait_for(second, 1) == 1
    assert arrivals.forming == {} and arrivals.entered == {}


def test_a_cohort_spread_over_several_gpus_is_not_chosen_for_as_one() -> None:
    """On two GPUs the cohort is shared out (each GPU's first request chooses for its share,
    alone), so the first request does not choose for all of it: its own task decides."""
    names = {f"{k}-g{g}": k for g in range(2) for k in ("plain", "eagle3")}
    urls = {n: f"http://127.0.0.1:{9000 + i}" for i, n in enumerate(names)}
    policy = RoutingPolicy(parse_config(fleet_config(names, urls, groups=True)))
    learner = Learner()
    for _ in range(20):
        for (task, bucket), speeds in WAVE_SPEEDS.items():
            for backend, speed in speeds.items():
                for g in range(2):
                    name = backend.replace("-g0", f"-g{g}")
                    learner.observe(Observation(task, bucket, name, speed, 64))
    state = {n: BackendSnapshot(True) for n in names}
    code = member("code").features
    mixed = [member(t) for t in ("rag", "chat", "creative")] * 2
    decision = policy.decide(code, state, random.Random(0), learner.view(), None, 6, mixed)
    assert decision.backends[0].startswith("eagle3-") and decision.concurrency == 4
    assert decision.adaptive is not None and not decision.adaptive.cohort


def test_requests_that_cannot_follow_the_choice_are_not_counted() -> None:
    """Chat, rag and creative waiting with a code request would send the wave to plain; but
    seeded ones that sample (pinned whatever the choice), ones refusing a speculation
    parameter, ones asking for X-Specgate-Speculation: off, and ones whose rule routes
    among other pools are left out of the mix: the first request's own choice stands."""
    policy, estimates = one_gpu(), wave_learner().view()
    state = {n: BackendSnapshot(True) for n in ("plain-g0", "eagle3-g0")}
    code = member("code").features
    others = [member(t) for t in ("rag", "chat", "creative")]
    cannot = {
        "seeded": [m._replace(seeded=True) for m in others],
        "refused": [
            m._replace(features=replace(m.features, spec_refused={"eagle3": frozenset({"min_p"})}))
            for m in others
        ],
        "off": [m._replace(features=replace(m.features, speculation="off")) for m in others],
    }
    for why, members in cannot.items():
        decision = policy.decide(code, state, random.Random(0), estimates, None, 3, members)
        assert decision.backends[0] == "eagle3-g0", why
        assert decision.adaptive is not None and not decision.adaptive.cohort, why
    data = fleet_config(
        {"plain-g0": "plain", "eagle3-g0": "eagle3"},
        {"plain-g0": "http://127.0.0.1:9000", "eagle3-g0": "http://127.0.0.1:9001"},
        groups=True,
    )
    data["rules"] = [
        {"name": "creative-plain", "match": {"tasks": ["creative"]}, "pool": "plain"},
        *data["rules"],
    ]
    pinned = RoutingPolicy(parse_config(data))  # creative on plain only: it cannot follow
    decision = pinned.decide(code, state, random.Random(0), estimates, None, 3, others)
    assert decision.adaptive is not None
    assert decision.adaptive.cohort == {"code": 1, "rag": 1, "chat": 1}


def test_a_cohort_reads_at_most_cohort_kinds_kinds() -> None:
    """Twelve requests of twelve measured tasks, each faster on plain: the first nine kinds
    (the first request's included) are read, the rest not."""
    learner = wave_learner()
    tasks = [f"task{i}" for i in range(12)]
    for _ in range(20):
        for task in tasks:
            learner.observe(Observation(task, "greedy/norep/c4", "plain-g0", 200.0, 64))
            learner.observe(Observation(task, "greedy/norep/c4", "eagle3-g0", 100.0, 64))
    policy = one_gpu()
    state = {n: BackendSnapshot(True) for n in ("plain-g0", "eagle3-g0")}
    members = [
        member("code")._replace(features=replace(member("code").features, task=t)) for t in tasks
    ]
    code = member("code").features
    decision = policy.decide(code, state, random.Random(0), learner.view(), None, 3, members)
    assert decision.adaptive is not None
    assert decision.adaptive.cohort == {"code": 1} | {t: 1 for t in tasks[: COHORT_KINDS - 1]}
    assert decision.backends[0] == "plain-g0"


def test_a_request_of_an_unmeasured_task_follows_the_busy_server() -> None:
    """A wave's first request went to plain (chosen for its cohort); a later one of a task
    nothing was measured for takes the rules' choice, but the first of it that keeps the
    compute's load together, as the static policy would: not EAGLE-3, the rules' first,
    beside the wave (on the simulator such a code request split a wave of four)."""
    policy, estimates = one_gpu(), wave_learner().view()
    busy = {"plain-g0": BackendSnapshot(True, inflight=1), "eagle3-g0": BackendSnapshot(True)}
    unmeasured = RequestFeatures(SIM_MODEL, 0.0, True, "summarise", 1.0, "header")
    decision = policy.decide(unmeasured, busy, random.Random(0), estimates, arriving=2)
    assert decision.backends[0] == "plain-g0"
    assert decision.adaptive is not None and decision.adaptive.untried
    idle = {n: BackendSnapshot(True) for n in busy}  # nothing to keep together: the rules' first
    assert policy.decide(unmeasured, idle, random.Random(0), estimates).backends[0] == "eagle3-g0"


async def test_the_cohort_s_first_request_reads_the_others_waiting() -> None:
    """Members entered wait in order of entry; the request that formed the cohort is told so
    (True), those that joined it are not, and each is gone from the members once routed."""
    arrivals: Arrivals[str] = Arrivals()
    seen: list[tuple[str, bool, list[str]]] = []

    async def request(name: str) -> None:
        with arrivals.enter(MODEL, name):
            led = await arrivals.settle(MODEL, cap=9)
            seen.append((name, led, arrivals.members(MODEL)))

    await asyncio.gather(*(request(n) for n in ("a", "b", "c")))
    assert seen[0] == ("a", True, ["a", "b", "c"])
    assert [(n, led) for n, led, _ in seen[1:]] == [("b", False), ("c", False)]
    assert arrivals.waiting == {} and arrivals.entered == {}


async def test_a_member_that_leaves_takes_only_its_own_entry() -> None:
    """Members alike compare equal: one cancelled while it waits removes its own entry, not
    the first equal one (the cohort's first request still reads the one that stays)."""
    arrivals: Arrivals[list[str]] = Arrivals()
    first, second, third = ["same"], ["same"], ["same"]  # equal, not the same object
    read: list[list[list[str]]] = []

    async def request(mine: list[str]) -> None:
        with arrivals.enter(MODEL, mine):
            if await arrivals.settle(MODEL, cap=9):
                read.append(arrivals.members(MODEL))

    lead = asyncio.ensure_future(request(first))
    await asyncio.sleep(0)
    leaving = asyncio.ensure_future(request(second))
    staying = asyncio.ensure_future(request(third))
    await asyncio.sleep(0)
    leaving.cancel()
    await asyncio.gather(lead, staying, leaving, return_exceptions=True)
    assert len(read) == 1 and [m is first or m is third for m in read[0]] == [True, True]
    assert arrivals.waiting == {} and arrivals.entered == {}


# -- the gateway: a wave after a quiet spell stays on one server -------------------------------


@pytest.mark.parametrize("config", [static_config, local_config], ids=["static", "adaptive"])
async def test_a_wave_after_a_quiet_spell_is_not_split(config) -> None:  # type: ignore[no-untyped-def]
    """Twelve code requests at once, on an idle gateway (the shipped local config: four
    servers on one compute group, speculative ones limited to a batch of 4): each lands on
    plain. Routed one at a time, the first met idle servers and went to a speculative one,
    and the next eight followed it (its limit x LEADER_SLACK): a wave split over two
    servers sharing the same cores. The first ten form the cohort (its cap: the first sees
    9 beside it, past 4 x 2, so the burst is known to be large); the last two go at once."""
    async with in_process(gateway_settings(), config()) as gw:
        for fake in gw.fakes.values():
            fake.first_delay_s = 0.05  # the wave is in flight together

        async def wave() -> set[str]:
            responses = await asyncio.gather(
                *(gw.client.post("/v1/completions", json=BODY) for _ in range(12))
            )
            assert {r.status_code for r in responses} == {200}
            return {r.headers["x-specgate-backend"] for r in responses}

        assert await wave() == {"plain"}
        cohorts = (await gw.client.get("/routes")).json()["decisions"]["cohorts"]
        assert cohorts == {"formed": 1, "requests": 10}
        # the next wave, within the peak window: its recent peak routes it, no cohort forms
        await asyncio.sleep(0.06)
        assert not gw.app.state.runtime.gateway.quiet(MODEL)
        assert await wave() == {"plain"}
        cohorts = (await gw.client.get("/routes")).json()["decisions"]["cohorts"]
        assert cohorts == {"formed": 1, "requests": 10}


async def test_a_lone_request_after_a_wave_is_learnt_at_its_own_load() -> None:
    """A request sent alone within a wave's memory is routed at the wave's remembered peak
    (12 here: the 8-15 band), but learnt at the load it ran in, alone (the sixteenth GPU
    run, docs/benchmarks.md section 7: a lone request after waves of 48 was learnt at 32-63
    requests at a lone request's speed). The wave's own requests keep its band."""
    async with in_process(gateway_settings(), local_config()) as gw:
        for fake in gw.fakes.values():
            fake.first_delay_s = 0.05  # the wave is in flight together
        wave = await asyncio.gather(
            *(gw.client.post("/v1/completions", json=BODY) for _ in range(12))
        )
        assert {r.status_code for r in wave} == {200}
        await asyncio.sleep(0.06)
        explain = (await gw.client.post("/routes/explain", json=BODY)).json()
        assert "c8" in explain["adaptive"]["bucket"]  # routed at the wave's peak
        assert (await gw.client.post("/v1/completions", json=BODY)).status_code == 200
        recent = (await gw.client.get("/routes")).json()["adaptive"]["recent"]
        assert [r["bucket"] for r in recent[:12]] == ["greedy/norep/c8"] * 12
        assert recent[-1]["bucket"] == "greedy/norep"  # alone: band 1


async def test_a_small_wave_stays_on_speculation(gw: InProcess) -> None:
    """Three code requests at once (a batch under max_batch_for_speculation): together on
    one speculative backend, as a lone request would go."""
    gw.app.state.runtime.gateway.reload(static_config())
    for fake in gw.fakes.values():
        fake.first_delay_s = 0.05
    responses = await asyncio.gather(
        *(gw.client.post("/v1/completions", json=BODY) for _ in range(3))
    )
    backends = {r.headers["x-specgate-backend"] for r in responses}
    assert len(backends) == 1 and backends <= SPECULATIVE


async def test_requests_under_load_route_at_once(gw: InProcess) -> None:
    """With one of this gateway's requests of the model in flight, a new one forms no cohort
    (it is routed at once, seeing the load in flight)."""
    gw.fakes["plain"].first_delay_s = 0.2
    runtime = gw.app.state.runtime
    busy = asyncio.ensure_future(
        gw.client.post("/v1/completions", json=BODY | {"temperature": 0.9})  # chat-like: plain
    )
    for _ in range(100):  # until the busy one is routed
        await asyncio.sleep(0.005)
        if not runtime.gateway.quiet(MODEL):
            break
    assert not runtime.gateway.quiet(MODEL)
    resp = await gw.client.post("/v1/completions", json=BODY)
    assert resp.status_code == 200 and (await busy).status_code == 200
    assert (await gw.client.get("/routes")).json()["decisions"]["cohorts"] == {
        "formed": 0,
        "requests": 0,
    }


async def test_requests_asking_for_speculation_do_not_push_a_burst_off_it(gw: InProcess) -> None:
    """One ordinary code request and five with X-Specgate-Speculation: on, at once: those five
    go to speculation whatever the load, so they are no load the first must avoid; all six
    land on speculative backends (counting them sent the first to plain, beside them)."""
    gw.app.state.runtime.gateway.reload(static_config())
    for fake in gw.fakes.values():
        fake.first_delay_s = 0.05
    on = {"x-specgate-speculation": "on"}
    responses = await asyncio.gather(
        gw.client.post("/v1/completions", json=BODY),
        *(gw.client.post("/v1/completions", json=BODY, headers=on) for _ in range(5)),
    )
    assert {r.headers["x-specgate-backend"] for r in responses} <= SPECULATIVE


def test_a_burst_on_one_gpu_leaves_the_others_quiet() -> None:
    """Eight GPUs, a recent burst of 12 on the first only: the others met nothing, so the next
    burst still forms a cohort (its first request would meet them idle); once every GPU held
    a large burst, the recent peaks route the next one and none forms."""
    from gateway.service import Gateway

    names = {f"{k}-g{g}": k for g in range(8) for k in ("plain", "eagle3")}
    urls = {n: f"http://127.0.0.1:{9000 + i}" for i, n in enumerate(names)}
    gateway = Gateway(parse_config(fleet_config(names, urls, groups=True)))
    now = gateway.registry.clock()
    gateway.registry.states["plain-g0"].note_load(now, 12)
    assert gateway.quiet(SIM_MODEL)
    for g in range(8):
        gateway.registry.states[f"eagle3-g{g}"].note_load(now, 12)
    assert not gateway.quiet(SIM_MODEL)
    for g in range(1, 8):  # all but g0 down: the GPU left held the burst itself
        gateway.registry.states[f"plain-g{g}"].mark(False)
        gateway.registry.states[f"eagle3-g{g}"].mark(False)
    assert not gateway.quiet(SIM_MODEL)  # g0 itself held the burst


async def test_a_wave_s_first_request_is_routed_with_the_others_as_its_cohort(
    gw: InProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three requests of three tasks at once on an idle gateway: the first to reach routing
    decides with the other two (their tasks) as its cohort; they follow with none."""
    gateway = gw.app.state.runtime.gateway
    decide, seen = gateway.decide, []

    def recording(features, prompt=None, **kwargs):  # type: ignore[no-untyped-def]
        seen.append((features.task, sorted(m.features.task for m in kwargs.get("cohort", ()))))
        return decide(features, prompt, **kwargs)

    monkeypatch.setattr(gateway, "decide", recording)
    for fake in gw.fakes.values():
        fake.first_delay_s = 0.05
    tasks = ("code", "rag", "chat")
    responses = await asyncio.gather(
        *(gw.client.post("/v1/completions", json=BODY, headers={"x-task-type": t}) for t in tasks)
    )
    assert {r.status_code for r in responses} == {200}
    first, *rest = seen
    assert sorted([first[0], *first[1]]) == sorted(tasks)
    assert [others for _, others in rest] == [[], []]
