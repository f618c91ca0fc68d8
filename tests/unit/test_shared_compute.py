"""Shared compute and load: backends of one compute group are not spread over, decode speed
is learnt per concurrency band, and measured speeds replace max_batch_for_speculation."""

from __future__ import annotations

import math
import random
import time
from dataclasses import replace

from bench.sim.fleet import fleet_config
from bench.sim.server import MODEL as SIM_MODEL
from contracts.config import parse_config
from gateway.classify.features import RequestFeatures
from gateway.routing.adaptive import Learner, Observation, bucket_of
from gateway.routing.load import break_even, load_view, measured_at_load
from gateway.routing.policy import BackendSnapshot, CohortMember, RouteDecision, RoutingPolicy
from gateway.service import Gateway
from gateway.settings import Settings
from gateway.trace import RequestTrace
from gateway.upstream.state import BackendRegistry, BackendState
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


def scraped(**running: float) -> dict[str, BackendSnapshot]:
    """Load of other clients only: scraped running counts, none of this gateway's."""
    return {
        n: BackendSnapshot(True, running=running.get(n, 0.0))
        for n in ("plain", "ngram", "draft", "eagle3")
    }


def test_measured_speeds_at_load_replace_the_configured_batch_limit() -> None:
    policy = RoutingPolicy(local_config())
    state = scraped(ngram=6)  # over ngram's max_batch_for_speculation of 4; c4 band (7 requests)
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


def test_a_replica_is_measured_at_load_when_its_kind_is() -> None:
    learner = learnt("greedy/norep/c4", {"plain-g0": 10.0, "ngram-g0": 14.0})
    buckets = dict.fromkeys(("plain-g0", "ngram-g0", "ngram-g1"), "greedy/norep/c4")
    view, kw = learner.view(), {"min_weight": 3, "decay": 0.98}
    assert not measured_at_load(view, "rag", buckets, "ngram-g1", ["plain-g0"], **kw)
    assert measured_at_load(
        view, "rag", buckets, "ngram-g1", ["plain-g0"], alike=["ngram-g0"], **kw
    )
    # once it answered the task itself its own record counts, as in the choice
    learnt("greedy/norep/c4", {"ngram-g1": 45.0}, n=1, learner=learner)
    assert not measured_at_load(
        learner.view(), "rag", buckets, "ngram-g1", ["plain-g0"], alike=["ngram-g0"], **kw
    )


def test_our_own_requests_in_a_scrape_are_not_counted_twice() -> None:
    """One request at a time: the scrape taken while ours ran counts it, but it is ours
    (counted exactly by the in-flight count), so once it ended the next request is not filed
    (or penalised) as concurrent; another client's request in the same scrape is."""
    state = BackendState(healthy=True, inflight=1)
    state.scraped(running=1.0, waiting=0.0, now=10.0)
    assert state.snapshot(10.5).batch == 1.0  # ours, in flight
    state.release()  # ours ended after that scrape
    assert state.snapshot(10.5).batch == 0.0
    state.inflight = 1
    state.scraped(running=3.0, waiting=1.0, now=11.0)  # ours and 3 of other clients
    snap = state.snapshot(11.0)
    assert (snap.inflight, snap.running, snap.waiting, snap.batch) == (1, 2, 1, 4.0)
    assert snap.outstanding == 2  # ours and the one queued


def test_a_scrape_of_other_clients_ages_by_the_mean_duration_of_our_requests() -> None:
    """Another client's wave, scraped while it ran, is not load a probe interval later:
    what the scrape before did not see ages as exp(-age / mean duration of our requests
    there); what both saw is steady traffic and stays."""
    state = BackendState(healthy=True)
    state.scraped(running=3.0, waiting=0.0, now=10.0)  # a wave of other clients'
    assert state.foreign_load(11.0) == 3.0  # none of ours answered there: no duration yet
    state.inflight = 2
    state.release(0.2)
    state.release(0.4)
    assert math.isclose(state.duration_s, 0.24)  # a running mean (weight 0.2), the first as is
    assert state.snapshot(10.0).batch == 3.0  # just scraped: counted in full
    assert math.isclose(state.foreign_load(10.48), 3.0 * math.exp(-2.0))
    assert state.snapshot(10.12).running == 2  # 3 x e^-0.5 = 1.8
    assert state.snapshot(10.48).running == 0  # 3 x e^-2 = 0.4: ended
    assert state.snapshot(12.0).batch == 0.0  # one probe interval later
    assert state.snapshot(9.0).running == 3  # a clock behind the scrape
    state.scraped(running=4.0, waiting=0.0, now=12.0)  # another replica's steady traffic
    assert state.foreign == 4.0 and state.foreign_prev == 3.0
    assert math.isclose(state.foreign_load(13.9), 3.0 + math.exp(-1.9 / 0.24))
    assert state.snapshot(13.9).batch == 3.0  # the 3 seen by both scrapes go on
    state.scraped(running=0.0, waiting=0.0, now=14.0)
    assert state.snapshot(14.0).batch == 0.0  # gone at the next scrape


def test_a_lone_request_after_another_clients_wave_runs_alone() -> None:
    """The thirteenth GPU run's case (docs/benchmarks.md section 7): requests sent one at a
    time, each after another client's request on the same GPU ended, read as a batch of 2
    from the scrape of that one: the GPU looked busy with plain, so the faster ngram was
    passed over (shared compute) and the answer was learnt at c2; with the scrape aged they
    run, and are learnt, at 1."""
    names = {"plain-g0": "plain", "ngram-g0": "ngram"}  # one GPU: compute group gpu0
    config = fleet_config(names, {"plain-g0": "http://p", "ngram-g0": "http://n"}, groups=True)
    registry = BackendRegistry(names, clock=lambda: 100.0)
    for state in registry.states.values():
        state.healthy = True
        state.inflight = 1
        state.release(0.35)  # ours took 0.35 s there
        state.scraped(running=0.0, waiting=0.0, now=97.0)
    registry.states["plain-g0"].scraped(running=1.0, waiting=0.0, now=99.0)  # another client's
    policy = RoutingPolicy(parse_config(config))
    decision = policy.decide(
        RequestFeatures(SIM_MODEL, 0.0, True, "rag", 1.0, "header"),
        registry.snapshot(),
        random.Random(0),
        learnt("greedy/norep", {"plain-g0": 15.0, "ngram-g0": 20.0}).view(),
    )
    assert decision.concurrency == 1
    assert decision.backends[0] == "ngram-g0"
    assert not any("shared compute" in r for r in decision.reasons)


def test_busy_members_follow_the_busiest_of_their_group() -> None:
    """A group split over two busy servers: only the busiest leads; the other follows."""
    groups = {"plain": "gpu0", "ngram": "gpu0", "eagle3": "gpu0", "draft": None}
    view = load_view(groups, {"plain": 5, "eagle3": 2})
    assert view.spreads == {"ngram"}  # idle member of a busy group
    assert view.followers == {"eagle3"}  # busy, but plain is busier
    assert view.concurrency["eagle3"] == 7
    tie = load_view(groups, {"plain": 3, "eagle3": 3})
    assert tie.followers == frozenset()  # two leaders: neither is discounted


def test_a_burst_of_ours_leads_its_group_over_a_larger_scraped_batch() -> None:
    """Our requests on plain (exact) lead over a scraped batch on ngram (possibly other
    clients' requests that ended since the scrape): ngram follows, eagle3 spreads."""
    groups = {"plain": "gpu0", "ngram": "gpu0", "eagle3": "gpu0"}
    view = load_view(groups, {"plain": 1, "ngram": 3}, inflight={"plain": 1})
    assert view.followers == {"ngram"} and view.spreads == {"eagle3"}
    assert view.bursts == {"plain"}
    assert view.concurrency["plain"] == 4  # the scraped batch still counts as load
    others = load_view(groups, {"plain": 1, "ngram": 3})  # none of it ours: the batch leads
    assert others.followers == {"plain"} and others.bursts == frozenset()
    # alone on its compute, a server splits nothing by passing a request elsewhere
    apart = {"plain": "gpu0", "eagle3": "gpu1"}
    assert load_view(apart, {"eagle3": 5}, inflight={"eagle3": 5}).bursts == frozenset()


def test_a_recent_burst_sets_the_load_of_an_idle_group() -> None:
    """The first request of a wave meets an idle group: the recent peak gives its band."""
    groups = {"plain": "gpu0", "eagle3": "gpu0", "draft": None}
    view = load_view(groups, {}, {"eagle3": 16.0, "draft": 4.0})
    assert view.concurrency == {"plain": 15, "eagle3": 15, "draft": 3}
    assert view.peaks == {"plain": 16, "eagle3": 16, "draft": 4}
    assert view.spreads == frozenset() and view.followers == frozenset()


def test_rag_follows_a_busy_plain_server_though_ngram_is_faster_alone() -> None:
    """Both busy: plain holds 3 of the group's requests, ngram 1; the discount goes to the
    follower, so rag joins plain's batch (local config: penalty 0.25, one compute group)."""
    policy = RoutingPolicy(local_config())
    learner = learnt("greedy/norep/c4", {"plain": 15.0, "ngram": 20.0})
    learnt("greedy/norep", ALONE, learner=learner)
    picks = [
        policy.decide(RAG, busy(plain=2, ngram=1), random.Random(s), learner.view()).backends[0]
        for s in range(20)
    ]
    assert picks.count("plain") == 20


def test_backend_state_remembers_its_recent_peak() -> None:
    state = BackendState()
    for _ in range(3):
        state.take(100.0)
    for _ in range(3):
        state.release()
    assert state.inflight == 0
    assert state.recent_peak(105.0) == 3 and state.snapshot(105.0).recent == 3.0
    state.take(112.0)  # a new slot: the last one's peak is still remembered
    assert state.recent_peak(113.0) == 3
    assert state.recent_peak(125.0) == 1  # the 100 s slot is gone, the 112 s one ended
    assert state.recent_peak(140.0) == 0  # nothing sent for two windows


def test_a_decision_counts_as_in_flight_until_its_attempt_begins() -> None:
    """Requests arriving together decide before any is forwarded: a reservation makes the
    second see the first's choice; it ends when the attempt begins, or expires."""
    state = BackendState()
    state.reserve(10.0)
    assert state.snapshot(10.1).inflight == 1
    state.take(10.2)  # the attempt begins: the reservation becomes the in-flight request
    assert state.inflight == 1 and state.snapshot(10.3).inflight == 1
    state.reserve(20.0)  # never forwarded (refused after routing): expires
    assert state.snapshot(20.5).inflight == 2 and state.snapshot(23.0).inflight == 1
    state.reserve(30.0)
    state.unreserve()  # the decision moved to another backend before forwarding
    assert state.snapshot(30.1).inflight == 1


def test_a_split_wave_reads_as_its_whole_size() -> None:
    """Nine requests routed to eagle3 and seven to plain on one GPU: the last one routed
    notes the group's 16 as its peak, so the next wave is routed as a wave of 16."""
    from types import SimpleNamespace

    from gateway.pipeline import _reserve

    config = local_config()
    states = {n: BackendState() for n in config.backends}
    gateway = SimpleNamespace(
        registry=SimpleNamespace(states=states), policy=RoutingPolicy(config), config=config
    )
    for name in ["eagle3"] * 9 + ["plain"] * 7:
        _reserve(gateway, name)  # type: ignore[arg-type]
    assert states["plain"].recent_peak(time.monotonic()) == 16
    view = load_view(
        {n: b.compute_group for n, b in config.backends.items()},
        {},
        {n: float(s.recent_peak(time.monotonic())) for n, s in states.items()},
    )
    assert set(view.concurrency.values()) == {15}


def with_limit(name: str, limit: int) -> RoutingPolicy:
    """The local config's policy with ``name``'s ``max_batch_for_speculation`` at ``limit``."""
    config = local_config()
    backend = config.backends[name].model_copy(update={"max_batch_for_speculation": limit})
    return RoutingPolicy(config.model_copy(update={"backends": config.backends | {name: backend}}))


def test_a_burst_explores_less_than_a_lone_request() -> None:
    """After a wave of 16 the group is idle again: the next wave's first request is chosen
    with a quarter of the draw's spread (the wave follows it), a lone request with all of it.
    (ngram's limit at 8: a wave of 16 is then within twice it, where learnt speeds decide.)"""
    policy = with_limit("ngram", 8)
    learner = learnt("greedy/norep/c16", {"plain": 15.0, "ngram": 16.0}, n=4)
    learnt("greedy/norep", {"plain": 15.0, "ngram": 16.0}, n=2, learner=learner)
    lone = {
        policy.decide(RAG, busy(), random.Random(s), learner.view()).backends[0] for s in range(60)
    }
    burst = busy() | {"plain": BackendSnapshot(True, recent=16.0)}
    wave = [
        policy.decide(RAG, burst, random.Random(s), learner.view()).backends[0] for s in range(60)
    ]
    assert {"plain", "ngram"} <= lone  # close speeds, few observations: both tried
    assert wave.count("ngram") > 45  # the better mean, nearly always


def test_a_burst_stays_on_the_speculative_backend_it_started_on() -> None:
    """ngram holds most of this gateway's requests on its busy group: up to LEADER_SLACK
    times its max_batch_for_speculation (4) the burst stays there rather than split the
    group's compute, whatever other clients run beside it; beyond it, or when the load there
    is other clients' (scraped) or more of ours runs on plain, the configured limit holds."""
    policy = RoutingPolicy(local_config())
    learner = learnt("greedy/norep", ALONE)

    def first(state: dict[str, BackendSnapshot]) -> str:
        return policy.decide(RAG, state, random.Random(0), learner.view()).backends[0]

    assert first(busy(ngram=6)) == "ngram"  # 6 > 4 but <= 8: it keeps its burst
    kept = policy.decide(RAG, busy(ngram=6), random.Random(0), learner.view()).candidates
    assert "batch 6 > max_batch_for_speculation 4, kept: our burst runs there" in next(
        c.why for c in kept if c.backend == "ngram"
    )
    assert first(busy(ngram=8)) == "ngram"
    over = policy.decide(RAG, busy(ngram=9), random.Random(0), learner.view())
    assert over.backends[0] != "ngram"
    assert "ngram: batch 9 > max_batch_for_speculation 4 x2 (our burst runs there)" in (
        " / ".join(over.reasons)
    )
    assert first(scraped(ngram=6)) != "ngram"  # other clients' load: no burst of ours there
    ghost = busy(ngram=2) | {"eagle3": BackendSnapshot(True, running=3.0)}
    assert first(ghost) == "ngram"  # a stale scrape elsewhere in the group: still our burst
    with_plain = busy(ngram=5) | {"plain": BackendSnapshot(True, inflight=6)}
    assert first(with_plain) != "ngram"  # a follower: plain is busier


def fleet(gpus: int) -> RoutingPolicy:
    """The simulator's fleet config: ``gpus`` GPUs, each running a plain and an EAGLE-3
    server (``plain-g0``, ``eagle3-g0``, ...), one compute group per GPU."""
    names = {f"{k}-g{g}": k for g in range(gpus) for k in ("plain", "eagle3")}
    urls = {n: f"http://127.0.0.1:{9000 + i}" for i, n in enumerate(names)}
    return RoutingPolicy(parse_config(fleet_config(names, urls, groups=True)))


def test_replicas_of_one_kind_are_balanced_by_load_not_by_learnt_speed() -> None:
    """Eight plain servers on eight GPUs are interchangeable: a request goes to the least
    loaded of them, even when one was learnt faster (that one would otherwise take every
    request until its load band changed: the herding the simulator showed at c=256)."""
    policy = fleet(4)
    twin_rag = RequestFeatures(SIM_MODEL, 0.0, True, "rag", 1.0, "header")
    learner = learnt("greedy/norep", {"plain-g0": 30.0, "plain-g1": 15.0, "plain-g2": 15.0,
                                      "plain-g3": 15.0, "eagle3-g0": 5.0, "eagle3-g1": 5.0,
                                      "eagle3-g2": 5.0, "eagle3-g3": 5.0})  # fmt: skip
    state = {n: BackendSnapshot(True) for n in policy.config.backends}
    for name, inflight in {"plain-g0": 6, "plain-g1": 3, "plain-g3": 1}.items():
        state[name] = BackendSnapshot(True, inflight=inflight)
    decision = policy.decide(twin_rag, state, random.Random(0), learner.view())
    assert decision.backends[0] == "plain-g2"
    assert "replicas: plain-g2 the least loaded of 4 alike (0 on its compute)" in decision.reasons
    assert set(decision.backends) == set(policy.config.backends)  # all stay failover targets
    # the queue first: a plain server beside a busy EAGLE-3 (1 on its GPU) stands for the
    # plain kind rather than one holding 4 on its own; on a tie, the one that has its GPU
    # to itself (the choice between kinds then discounts the shared one)
    state["eagle3-g2"] = BackendSnapshot(True, inflight=1)
    state["plain-g3"] = BackendSnapshot(True, inflight=4)

    def plain_replica() -> str:
        reasons = policy.decide(twin_rag, state, random.Random(0), learner.view()).reasons
        return next(r for r in reasons if r.startswith("replicas: plain"))

    assert plain_replica() == "replicas: plain-g2 the least loaded of 4 alike (1 on its compute)"
    state["plain-g3"] = BackendSnapshot(True, inflight=1)
    assert plain_replica() == "replicas: plain-g3 the least loaded of 4 alike (1 on its compute)"


def test_a_request_that_shared_its_gpu_with_another_server_of_ours_teaches_nothing() -> None:
    """Servers of one GPU time-slice it: a lone EAGLE-3 request beside a busy plain server
    runs fast and the plain batch slows, so neither speed is the backend's at that load.
    Such a request (another server of its GPU busy with ours at dispatch, ``trace.shared``,
    or as it ends) is counted, not learnt; on a GPU of its own it teaches as before."""
    policy = fleet(2)
    gateway = Gateway(policy.config, registry=BackendRegistry(policy.config.backends))
    code = RequestFeatures(SIM_MODEL, 0.0, True, "code", 1.0, "header")

    def finish(backend: str, shared: bool = False) -> None:
        trace = RequestTrace("r", "chat/completions", stream=False, shared=shared)
        trace.backend, trace.task, trace.features = backend, "code", code
        trace.usage_bytes = b'{"usage":{"completion_tokens":64}}'
        trace.status, trace.duration_s = 200, 0.3
        gateway.learn(trace)

    assert gateway.shares_compute("eagle3-g0") is False
    finish("eagle3-g0")
    assert gateway.feedback.learner.observations == 1
    gateway.registry.states["plain-g0"].inflight = 30  # a wave of ours on g0's plain server
    assert gateway.shares_compute("eagle3-g0") and not gateway.shares_compute("eagle3-g1")
    finish("eagle3-g0")  # ended beside it
    finish("eagle3-g1", shared=True)  # dispatched beside a busy server of its GPU
    finish("eagle3-g1")  # alone on g1
    assert gateway.feedback.learner.observations == 2
    assert gateway.feedback.shared == 2 and gateway.feedback.to_json()["shared"] == 2


def test_a_request_beside_which_another_server_of_its_gpu_ran_ours_teaches_nothing() -> None:
    """Idle beside it at dispatch and as it ends is not enough: a request during whose life
    another server of its GPU took and ended one of ours (a split wave's plain share that
    ended first) ran part of its time beside it, so it is counted, not learnt. One that moved
    to another backend (a failover) keeps the checks at its end."""
    policy = fleet(2)
    gateway = Gateway(policy.config, registry=BackendRegistry(policy.config.backends))
    states = gateway.registry.states
    beside = dispatched(gateway, "eagle3-g0", take=True)
    alone = dispatched(gateway, "eagle3-g1", take=True)
    states["plain-g0"].take(0.0)  # one of ours on g0's plain server, ended before beside
    states["plain-g0"].release(0.2)
    states["plain-g1"].take(0.0, counted=False)  # a /tokenize on g1: no GPU batch slot
    states["plain-g1"].release(counted=False)
    for trace in (beside, alone):
        finish(gateway, trace)
    assert (beside.shared, alone.shared) == (True, False)
    assert gateway.feedback.learner.observations == 1 and gateway.feedback.shared == 1
    moved = dispatched(gateway, "eagle3-g1", take=True)
    states["eagle3-g1"].release()  # its attempt failed before answering: a failover
    moved.backend = "plain-g1"
    states["plain-g1"].take(0.0)
    finish(gateway, moved)  # its own first attempt ended beside it: not another request's
    assert not moved.shared and gateway.feedback.learner.observations == 2


def test_a_request_is_learnt_at_the_load_it_can_have_run_beside() -> None:
    """Routing counts a compute group's recent peak as its load (a burst's first requests
    meet idle servers), and a request used to be learnt there too: a lone code request 19 s
    after waves of 48, pinned to EAGLE-3 by its seed, was learnt at 32-63 requests at a lone
    request's speed (the sixteenth GPU run: 335 tokens/s where a wave of 32 ran EAGLE-3 at
    151, docs/benchmarks.md section 7). Its band is now at most the requests on the group at
    dispatch (without the peak) and ours begun there since; a wave's first request, which
    met an idle server, is still learnt at the wave it ran in."""
    policy = fleet(1)
    gateway = Gateway(policy.config, registry=BackendRegistry(policy.config.backends))
    now = time.monotonic()
    gateway.registry.states["plain-g0"].note_load(now, 48)  # a burst of 48, just ended
    decision = gateway.decide(RequestFeatures(SIM_MODEL, 0.0, True, "code", 1.0, "header"))
    assert decision.concurrency == 48  # the peak less one, + 1
    assert decision.backend is not None
    lone = dispatched(gateway, decision.backend, take=True)
    assert lone.mark is not None and lone.mark.joined == 1
    lone.concurrency = decision.concurrency
    finish(gateway, lone)
    assert lone.concurrency == 1
    assert gateway.feedback.records()[-1]["bucket"] == "greedy/norep"  # band 1, not c32
    first = dispatched(gateway, "eagle3-g0", take=True)
    first.concurrency = 48.0
    for _ in range(15):  # the rest of its wave of 16, on the same server
        gateway.registry.states["eagle3-g0"].take(now)
    finish(gateway, first)
    assert first.concurrency == 16
    assert gateway.feedback.records()[-1]["bucket"] == "greedy/norep/c16"
    # one more while the wave's other 15 still run, two following it: 18 at most
    late = dispatched(gateway, "eagle3-g0", take=True)
    assert late.mark is not None and late.mark.joined == 16
    late.concurrency = 48.0
    for _ in range(2):
        gateway.registry.states["eagle3-g0"].take(now)
    finish(gateway, late)
    assert late.concurrency == 18


def finish(gateway: Gateway, trace: RequestTrace) -> None:
    """``trace``'s attempt ends (its backend's slot given back), then it is learnt."""
    assert trace.backend is not None
    gateway.registry.states[trace.backend].release(trace.duration_s)
    gateway.learn(trace)


def dispatched(gateway: Gateway, backend: str, take: bool = False) -> RequestTrace:
    """A finished greedy code request (64 tokens in 0.3 s) routed to ``backend`` (its
    decision reserved there) and its compute group marked, as the pipeline does at dispatch;
    ``take``: its own attempt began there."""
    trace = RequestTrace("r", "chat/completions", stream=False)
    state = gateway.registry.states[backend]
    state.reserve(time.monotonic())
    trace.mark = gateway.compute_mark(backend)
    if take:
        state.take(time.monotonic())
    trace.backend, trace.task = backend, "code"
    trace.features = RequestFeatures(SIM_MODEL, 0.0, True, "code", 1.0, "header")
    trace.usage_bytes = b'{"usage":{"completion_tokens":64}}'
    trace.status, trace.duration_s = 200, 0.3
    return trace


def test_the_peak_window_is_a_setting() -> None:
    """A burst's peak is remembered 1-2 windows (default 10 s); a simulator running at 10x
    real time sets 100 s (SPECGATE_PEAK_WINDOW_S) so its bursts are remembered as long in
    simulated time."""
    default = BackendRegistry(["a"]).states["a"]
    slow = BackendRegistry(["a"], peak_window_s=100.0).states["a"]
    for state in (default, slow):
        state.note_load(1000.0, 32)
    assert default.recent_peak(1015.0) == 32 and default.recent_peak(1021.0) == 0
    assert slow.recent_peak(1150.0) == 32 and slow.recent_peak(1201.0) == 0
    assert BackendState().recent_peak(0.0) == 0  # a fresh state remembers no burst
    assert Settings(peak_window_s=100.0).peak_window_s == 100.0


def test_learnt_speeds_start_a_burst_at_most_twice_past_the_limit() -> None:
    """What a load band learnt at its bottom starts a burst on a speculative backend up to
    LEADER_SLACK times its limit, not past it: the GPU twin's waves of 32 taught the 32-63
    band (bands doubled then) that EAGLE-3 was faster, its waves of 48 then went
    there as cohorts of 33 and split over EAGLE-3 and plain at 0.58-0.61x plain
    (docs/benchmarks.md section 7, "Twenty-second run"). A cohort of the cap's size now goes
    to plain; a burst already running on EAGLE-3 keeps it while learnt faster there."""
    policy = with_limit("eagle3", 16)
    code = RequestFeatures(MODEL, 0.0, True, "code", 1.0, "header")
    learner = Learner()
    for _ in range(20):
        for backend, speed in {"plain": 100.0, "eagle3": 130.0}.items():
            learner.observe(Observation("code", "greedy/norep/c32", backend, speed, 64))

    def first(state: dict[str, BackendSnapshot], arriving: int = 0) -> RouteDecision:
        return policy.decide(code, state, random.Random(0), learner.view(), arriving=arriving)

    assert policy.cohort_cap(MODEL) == 34
    within = first(busy(), arriving=32)  # 33 on the GPU, 32 beside the first: twice the limit
    assert within.backends[0] == "eagle3"
    capped = first(busy(), arriving=policy.cohort_cap(MODEL) - 1)
    assert capped.backends[0] == "plain"
    assert (
        "eagle3: batch 33 > max_batch_for_speculation 16 x2 (learnt speeds decide only up to"
        " there): speculation loses" in capped.reasons
    )
    assert first(busy(eagle3=40)).backends[0] == "eagle3"  # our burst there: it stays


def test_a_cohort_probes_a_backend_never_observed_past_its_limit_once() -> None:
    """Past its max_batch_for_speculation (up to LEADER_SLACK times it) a speculative backend
    never observed for the task at that load stays a candidate for a cohort's first request
    on an idle compute, so the cohort measures it there (the GPU twin: EAGLE-3 ran waves of
    32 at 1.09x plain and never got one; docs/benchmarks.md section 7, "Twenty-third run").
    Once per (task, bucket, band): the gateway marks the probe where the request went. Never
    for a lone request, a cohort not all following it, busy compute, a recent peak, past
    twice the limit, a band measured, a client asking for speculation, or a fresh gateway
    (the rules' choice)."""
    config = with_limit("eagle3", 16).config
    gateway = Gateway(config, registry=BackendRegistry(config.backends))
    learner = gateway.feedback.learner
    code = RequestFeatures(MODEL, 0.0, True, "code", 1.0, "header")

    def first(
        state: dict[str, BackendSnapshot],
        arriving: int,
        members: int | None = None,
        features: RequestFeatures = code,
    ) -> RouteDecision:
        follow = [CohortMember(features, None)] * (arriving if members is None else members)
        view = learner.view()
        return gateway.policy.decide(
            features, state, random.Random(0), view, None, arriving, follow
        )

    def probed_none(decision: RouteDecision) -> bool:
        eagle3 = next(c for c in decision.candidates if c.backend == "eagle3")
        return (
            decision.probe is None
            and not any("probing" in r for r in decision.reasons)
            and (not eagle3.kept or "kept: never measured" not in eagle3.why)
        )

    fresh = first(busy(), 31)
    assert fresh.backends[0] == "plain" and probed_none(fresh)  # nothing learnt for code
    for _ in range(20):
        for backend, speed in {"plain": 100.0, "eagle3": 180.0}.items():
            learner.observe(Observation("code", "greedy/norep/c16", backend, speed, 64))
        learner.observe(Observation("code", "greedy/norep/c32", "plain", 80.0, 64))
    wave = first(busy(), 31)  # a cohort of 32 on an idle GPU: band c32, never observed
    assert wave.backends[0] == "eagle3" and wave.probe == ("eagle3", "greedy/norep/c32")
    assert (
        "eagle3: probing past max_batch_for_speculation (never measured at this load)"
        in wave.reasons
    )
    peak = busy() | {"plain": BackendSnapshot(True, recent=32.0)}
    asks = replace(code, speculation="on")
    for decision in (
        first(busy(), 40),  # past twice the limit
        first(busy(), 31, members=0),  # no cohort follows it
        first(busy(), 31, members=30),  # one arriving request does not follow it
        first(busy(plain=20), 11),  # busy compute
        first(peak, 20),  # 31 of the load is the recent peak's, not the cohort's
    ):
        assert decision.backends[0] == "plain" and probed_none(decision), decision.reasons
    assert probed_none(first(busy(), 31, features=asks))  # the client's call, not a probe
    # routed elsewhere (a guard, a pin): not marked, the next cohort probes
    gateway.probed(replace(wave, backends=("plain", "eagle3")))
    assert first(busy(), 31).probe == wave.probe
    gateway.probed(wave)  # routed there: marked, never listed, not probed again
    assert learner.view()[("code", "greedy/norep/c32")].backends["eagle3"].requests == 0
    assert not any(
        g["bucket"] == "greedy/norep/c32" and "eagle3" in g["backends"] for g in learner.summary()
    )
    again = first(busy(), 31)
    assert again.backends[0] == "plain" and probed_none(again)
    # a band measured for both: learnt speeds decide, no probe
    for _ in range(5):
        learner.observe(Observation("code", "greedy/norep/c24", "eagle3", 150.0, 64))
        learner.observe(Observation("code", "greedy/norep/c24", "plain", 90.0, 64))
    measured = first(busy(), 23)
    assert measured.backends[0] == "eagle3" and probed_none(measured)


def test_from_16_on_a_band_compares_backends_at_one_load() -> None:
    """Bands from 16 on are half a doubling wide: plain's answers in waves of 48 (slower a
    request) no longer share a band with EAGLE-3's waves of 32, so a wave of 32 compares
    them at 32. With one 32-63 band plain's figure there mixed both loads and EAGLE-3 won
    at 32 where plain ran faster (the GPU twin: plain 123 tokens/s a request in waves of
    32, 96 in waves of 48; docs/benchmarks.md section 7, "Twenty-third run")."""
    policy = with_limit("eagle3", 16)
    code = RequestFeatures(MODEL, 0.0, True, "code", 1.0, "header")
    at = {load: bucket_of(0.0, None, 0.05, load) for load in (32, 48)}
    assert at == {32: "greedy/norep/c32", 48: "greedy/norep/c48"}
    learner = Learner()
    for _ in range(10):
        learner.observe(Observation("code", at[32], "plain", 120.0, 64))
        learner.observe(Observation("code", at[32], "eagle3", 105.0, 64))
    for _ in range(30):
        learner.observe(Observation("code", at[48], "plain", 80.0, 64))
    picks = {
        policy.decide(code, busy(), random.Random(s), learner.view(), arriving=31).backends[0]
        for s in range(20)
    }
    assert picks == {"plain"}
