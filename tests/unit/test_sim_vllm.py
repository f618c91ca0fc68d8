"""The simulated vLLM backend (bench/sim): batching, GPU time-slicing, acceptance, the HTTP
shapes of vLLM 0.26 and 0.32, and the twin profile's orderings. Times are asserted on the
simulated clock's logical times, so the tests run fast (scale 0.05) without depending on the
machine's load (arrivals are real events: requests sent together are asserted on the steps
after their first token)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from bench import sim_calibrate
from bench.sim.book import book_for
from bench.sim.derive import cells, pooled
from bench.sim.engine import Clock, Engine, Gpu, PromptBook, SimRequest, prompt_key
from bench.sim.profile import AcceptanceModel, KindProfile, StepCost, load_profile
from bench.sim.server import build_fleet, create_sim_app
from contracts.vllm_metrics import parse_vllm_metrics
from tests.fakes.servers import running_server

FAST = 0.05  # real seconds per simulated second
TASKS = ("code", "rag", "chat", "creative")


def flat_kind(step_ms: float = 10.0, k: int = 0, accept: float = 0.0) -> KindProfile:
    """A kind whose steps all cost ``step_ms`` (no latency, admission or prefill cost)."""
    acceptance = None
    if k:
        acceptance = AcceptanceModel(
            draft_share=dict.fromkeys(TASKS, 1.0),
            accept=dict.fromkeys(TASKS, accept),
            measured_temperature=dict.fromkeys(TASKS, 0.0),
            temperature_curve=((0.0, 1.0), (1.0, 1.0)),
        )
    cost = StepCost(k=k, step_ms=((1, step_ms),), latency_ms=0, admit_ms=0, prefill_ms_per_token=0)
    return KindProfile("eagle3" if k else "none", cost, acceptance)


def request(tokens: int, task: str = "code", temperature: float = 0.0) -> SimRequest:
    return SimRequest(task, temperature, 10, tokens, prompt_key(f"{task}{tokens}"))


async def run(engine: Engine, req: SimRequest) -> list[int]:
    return [n async for n in engine.generate(req)]


async def test_servers_on_one_gpu_time_slice_it_and_on_two_gpus_do_not() -> None:
    clock = Clock(FAST)
    shared = Gpu(clock)
    a, b = Engine("a", flat_kind(), shared), Engine("b", flat_kind(), shared)
    ra, rb = request(10), request(10)
    await asyncio.gather(run(a, ra), run(b, rb))
    # 9 steps after the first token, 10 ms each, the two servers' steps one at a time
    for r in (ra, rb):
        assert r.finished_at is not None and r.first_token_at is not None
        assert r.finished_at - r.first_token_at == pytest.approx(0.18, abs=1e-6)

    c, d = Engine("c", flat_kind(), Gpu(clock)), Engine("d", flat_kind(), Gpu(clock))
    rc, rd = request(10), request(10)
    await asyncio.gather(run(c, rc), run(d, rd))
    for r in (rc, rd):
        assert r.finished_at is not None and r.first_token_at is not None
        assert r.finished_at - r.first_token_at == pytest.approx(0.09, abs=1e-6)


async def test_continuous_batching_serves_a_batch_in_the_steps_of_one_request() -> None:
    engine = Engine("p", flat_kind(), Gpu(Clock(FAST)))
    reqs = [request(8) for _ in range(6)] + [request(3)]
    chunks = await asyncio.gather(*(run(engine, r) for r in reqs))
    assert [sum(c) for c in chunks] == [8] * 6 + [3]
    assert all(c == [1] * len(c) for c in chunks)  # plain: one token a step
    first = min(r.arrival for r in reqs)
    assert [r.finished_at for r in reqs[:6]] == [pytest.approx(first + 0.08, abs=1e-6)] * 6
    assert engine.spec is None


async def test_accepted_drafts_give_k_plus_one_tokens_a_step_and_count_like_vllm() -> None:
    sure = Engine("e", flat_kind(k=3, accept=1.0), Gpu(Clock(FAST)))
    req = request(12)
    assert await run(sure, req) == [1, 4, 4, 3]  # prefill's token, then 1 + 3 (last capped)
    assert sure.spec is not None
    assert (sure.spec.drafts, sure.spec.draft_tokens, sure.spec.accepted_tokens) == (3, 9, 9)
    assert sure.spec.accepted_per_pos == [3, 3, 3]
    assert (req.spec_steps, req.accepted, req.histogram) == (3, 9, [0, 0, 0, 3])

    never = Engine("n", flat_kind(k=3, accept=0.0), Gpu(Clock(FAST)))
    assert await run(never, request(5)) == [1, 1, 1, 1, 1]
    assert never.spec is not None and never.spec.accepted_tokens == 0
    assert never.spec.draft_tokens == 12


async def test_a_client_that_leaves_aborts_its_request() -> None:
    engine = Engine("p", flat_kind(), Gpu(Clock(FAST)))
    req = request(1000)
    gen = engine.generate(req)
    assert await anext(gen) == 1
    await gen.aclose()
    await asyncio.sleep(0.01)
    assert engine.inflight == 0
    assert req not in engine.running
    await engine.close()


@pytest.mark.parametrize("prefix_cache", [True, False])
async def test_a_repeated_prompt_skips_its_prefill_only_with_the_prefix_cache(
    prefix_cache: bool,
) -> None:
    """Prefill costs 0.5 ms (simulated) a prompt token on top of a 10 ms step: a 200-token
    prompt's first token comes 110 ms after it arrives; the same prompt again, 10 ms with the
    prefix cache (no prefill), 110 ms again without it (``--no-enable-prefix-caching``)."""
    flat = flat_kind()
    kind = replace(flat, cost=replace(flat.cost, prefill_ms_per_token=0.5))
    engine = Engine("p", kind, Gpu(Clock(FAST)), prefix_cache=prefix_cache)
    ttft_s = []
    for _ in range(2):
        req = SimRequest("rag", 0.0, 200, 3, prompt_key("one long rag prompt"))
        assert await run(engine, req) == [1, 1, 1]
        assert req.first_token_at is not None
        ttft_s.append(req.first_token_at - req.arrival)
    await engine.close()
    assert ttft_s[0] == pytest.approx(0.110, abs=1e-6)
    assert ttft_s[1] == pytest.approx(0.010 if prefix_cache else 0.110, abs=1e-6)
    assert engine.prompt_tokens_total == 400  # vLLM counts cached prompt tokens too


def test_twin_acceptance_falls_with_task_and_temperature() -> None:
    eagle = load_profile().kinds["eagle3"].acceptance
    assert eagle is not None
    code, creative = eagle.per_token("code", 0.2)[1], eagle.per_token("creative", 1.0)[1]
    assert code > creative
    assert eagle.per_token("code", 1.0)[1] < code  # code sampled hot accepts less
    assert eagle.per_token("unknown-task", 0.7) == eagle.per_token("chat", 0.7)


PROFILES = sorted((Path(__file__).parents[2] / "bench" / "sim").glob("twin-*.json"))


def test_every_committed_profile_loads_with_the_three_kinds() -> None:
    assert len(PROFILES) >= 3
    for path in PROFILES:
        profile = load_profile(path)
        assert set(profile.kinds) == {"plain", "ngram", "eagle3"}
        assert set(profile.measured["eagle3"]) == {1, 4, 8, 16, 32, 64}
        assert profile.per_task == (12 if "h100" in path.name else 16)  # the run's sample


def test_repeats_are_pooled_cell_by_cell() -> None:
    """``bench.sim.derive`` over several repeats: every repeat's outcomes of a cell
    together (total over total), the first repeat's meta."""
    outcome = {"task": "code", "error": None}
    repeats = [
        {"meta": {"date": "d", "items": []}, "runs": [{"target": "plain", "concurrency": 1,
                                                       "outcomes": [outcome] * n}]}
        for n in (2, 3)
    ]  # fmt: skip
    doc = pooled(repeats)
    assert doc["meta"]["date"] == "d (2 pooled)"
    assert len(cells(doc)[("plain", 1, "code")]) == 5
    assert pooled(repeats[:1]) is repeats[0]


def test_calibration_fits_only_to_the_profiles_own_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``bench.sim_calibrate --against`` compares with another run; fitting to it would
    make that comparison in-sample, so the two are refused together, and a file that is no
    ``bench.speedup`` results is said to be so (both before any replay)."""
    with pytest.raises(SystemExit) as exit_info:
        sim_calibrate.main(["--fit", "--against", "r1/speedup/results.json"])
    assert exit_info.value.code == 2
    assert "--fit fits the profile to its own run" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # not a results file: said, no traceback
        sim_calibrate.main(["--against", str(Path(__file__))])
    assert exit_info.value.code == 2
    assert "--against: not bench.speedup results" in capsys.readouterr().err
    empty = tmp_path / "results.json"  # results without a run: said, no traceback
    empty.write_text(json.dumps({"meta": {"items": [], "per_task": 12}, "runs": []}))
    with pytest.raises(SystemExit) as exit_info:
        sim_calibrate.main(["--against", str(empty)])
    assert exit_info.value.code == 2
    assert "--against: not bench.speedup results of every cell" in capsys.readouterr().err


def _results(concurrencies: tuple[int, ...]) -> dict[str, Any]:
    """bench.speedup results with plain, ngram and EAGLE-3 alone at ``concurrencies``, one
    64-token request a task and cell, EAGLE-3 twice plain's speed, ngram plain's."""
    tasks = ("code", "rag", "chat", "creative")
    items = [{"task": t, "id": f"{t}-1", "prompt_chars": 400, "temperature": 0.0} for t in tasks]
    speed = {"plain": 1.0, "ngram": 1.0, "eagle3": 2.0}
    runs = [
        {
            "target": kind,
            "concurrency": c,
            "outcomes": [
                {
                    "task": t,
                    "id": f"{t}-1",
                    "ttft_s": 0.05,
                    "e2e_s": 0.5 / speed[kind],
                    "output_tokens": 64,
                    "chunks": 64 if kind == "plain" else 32,
                }
                for t in tasks
            ],
        }
        for kind in speed
        for c in concurrencies
    ]
    return {"meta": {"items": items, "per_task": 1, "date": "test"}, "runs": runs}


def test_an_answer_without_text_counts_in_speed_not_in_step_times(tmp_path: Path) -> None:
    """A sampled request that ends at its first token with no text (one token, EOS: one in
    the twentieth GPU run) has no first token time: derive() counts its token and time in
    the cell's tokens/s and leaves it out of step times and first tokens."""
    results = _results((4, 8))
    empty = {"task": "creative", "id": "creative-2", "ttft_s": None, "e2e_s": 0.5}
    for run in results["runs"]:
        if run["target"] == "plain":
            run["outcomes"].append(empty | {"output_tokens": 1, "chunks": 0})
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    measured = sim_calibrate.against([path]).measured
    assert measured["plain"][8]["creative"] == pytest.approx(65 / 1.0)
    assert measured["plain"][8]["code"] == pytest.approx(64 / 0.5)


def test_calibration_compares_with_a_run_of_some_concurrencies_only(tmp_path: Path) -> None:
    """A GPU run of ``CONCURRENCY=4,8,16`` (session 30) is compared on its own
    concurrencies, not refused for lacking c=1, 32 and 64; a run missing a backend's cell
    at one of them is refused."""
    path = tmp_path / "results.json"
    path.write_text(json.dumps(_results((4, 8, 16))))
    measured, per_task, concurrencies, dealing, cached = sim_calibrate.against([path])
    assert concurrencies == [4, 8, 16] and dealing == "mixed" and cached
    assert per_task == 1
    assert measured["eagle3"][8]["code"] == pytest.approx(2 * measured["plain"][8]["code"])
    simulated = {
        k: {
            c: dict.fromkeys(("code", "rag", "chat", "creative"), 100.0)
            for c in (1, 4, 8, 16, 32, 64)
        }
        for k in ("plain", "ngram", "eagle3")
    }
    text, worst, within = sim_calibrate.table(simulated, measured, concurrencies)
    assert text.splitlines()[0] == "| backend | task | c=4 | c=8 | c=16 |"
    assert (worst, within) == (pytest.approx(0.5), 12)  # ngram's 12 cells right, EAGLE-3's half
    partial = _results((4, 8))
    partial["runs"] = [
        r for r in partial["runs"] if (r["target"], r["concurrency"]) != ("eagle3", 8)
    ]
    path.write_text(json.dumps(partial))
    with pytest.raises(ZeroDivisionError):  # derive() computes every backend's cell
        sim_calibrate.against([path])
    path.write_text(json.dumps(_results((2,))))  # none of the calibration's concurrencies
    with pytest.raises(ValueError, match="no plain at any of c=1, 4, 8, 16, 32, 64"):
        sim_calibrate.against([path])
    per_task = _results((4, 8))
    per_task["meta"]["waves"] = "per-task"  # bench.speedup --waves per-task: replayed so
    path.write_text(json.dumps(per_task))
    assert sim_calibrate.against([path]).dealing == "per-task"
    mixed = tmp_path / "mixed.json"
    mixed.write_text(json.dumps(_results((4, 8))))
    with pytest.raises(ValueError, match="repeats set up alike only"):
        sim_calibrate.against([path, mixed])
    per_task["meta"]["prefix_cache"] = False  # bench.speedup --no-prefix-cache: replayed so
    path.write_text(json.dumps(per_task))
    assert sim_calibrate.against([path]).prefix_cache is False


async def replay(kind: str, concurrency: int, task: str) -> float:
    """Output tokens/s per request of 16 ``task`` requests of 64 tokens at ``concurrency``
    on the twin profile's ``kind`` alone (simulated time)."""
    profile = load_profile()
    engine = Engine(kind, profile.kinds[kind], Gpu(Clock(FAST)), plain=profile.kinds["plain"])
    temperature = profile.temperatures[task]
    reqs = [SimRequest(task, temperature, 100, 64, prompt_key(f"{task}{i}")) for i in range(16)]
    for i in range(0, 16, concurrency):
        await asyncio.gather(*(run(engine, r) for r in reqs[i : i + concurrency]))
    await engine.close()
    return sum(r.produced for r in reqs) / sum(r.finished_at - r.arrival for r in reqs)  # type: ignore[operator]


async def test_twin_profile_keeps_the_measured_orderings() -> None:
    # measured (docs/benchmarks.md section 7): EAGLE-3 1.47x plain on code at c=1, ngram
    # 0.56x on chat at c=1 (one request at a time: every time is logical, so the machine's
    # load cannot move it; a wave's arrivals are real events, spread by a loaded machine at
    # this fast scale, so higher loads are left to bench.sim_calibrate)
    plain1, eagle1 = await replay("plain", 1, "code"), await replay("eagle3", 1, "code")
    assert 1.25 < eagle1 / plain1 < 1.7
    ngram_chat = await replay("ngram", 1, "chat") / await replay("plain", 1, "chat")
    assert 0.45 < ngram_chat < 0.7


@pytest.fixture
def book() -> PromptBook:
    profile = load_profile()
    return PromptBook(profile, {prompt_key("def add(a, b):"): ("code", 7)})


def sse(text: str) -> list[Any]:
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


@pytest.mark.parametrize("version", ["0.26", "0.32"])
async def test_a_stream_has_a_chunk_a_step_usage_and_done_in_each_versions_shape(
    book: PromptBook, version: str
) -> None:
    profile = load_profile()
    engine = Engine(
        "eagle3", profile.kinds["eagle3"], Gpu(Clock(FAST)), plain=profile.kinds["plain"]
    )
    app = create_sim_app(engine, book, version=version)
    body = {
        "model": "smollm2-twin",
        "messages": [{"role": "user", "content": "def add(a, b):"}],
        "max_tokens": 64,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://s") as c:
        r = await c.post("/v1/chat/completions", json=body)
    assert r.status_code == 200
    chunks = sse(r.text)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    content = [ch for ch in chunks if ch["choices"]]
    words = "".join(ch["choices"][0]["delta"]["content"] for ch in content)
    assert words.split() == ["w"] * 7  # the book's length for this prompt
    assert content[-1]["choices"][0]["finish_reason"] == "stop"  # 7 < max_tokens
    final = chunks[-1]
    assert final["choices"] == []
    assert final["usage"]["completion_tokens"] == 7
    metrics = final["metrics"]
    if version == "0.32":
        spec = metrics["speculative_decoding"]
        assert spec["num_draft_tokens"] == 3 * spec["num_spec_steps"]
        assert final["system_fingerprint"] == "vllm-0.32.0-sim"
        assert len(content) == 2 + spec["num_spec_steps"]  # role, prefill token, one a step
    else:
        assert set(metrics) == {
            "time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms",
            "tokens_per_second",
        }  # fmt: skip
        assert "system_fingerprint" not in final


async def test_metrics_page_parses_as_vllms_and_counts_the_drafts(book: PromptBook) -> None:
    profile = load_profile()
    clock = Clock(FAST)
    servers = build_fleet(profile, [["plain", "eagle3"]], book, clock, version="0.32")
    plain, eagle = servers
    assert (plain.name, eagle.name) == ("plain-g0", "eagle3-g0")
    body = {"model": "smollm2-twin", "prompt": "def add(a, b):", "max_tokens": 5}
    pages = {}
    for s in servers:
        transport = httpx.ASGITransport(s.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://s") as c:
            answer = (await c.post("/v1/completions", json=body)).json()
            assert answer["choices"][0]["finish_reason"] == "length"
            assert answer["usage"]["completion_tokens"] == 5
            pages[s.name] = (await c.get("/metrics")).text
    assert parse_vllm_metrics(pages["plain-g0"]).spec is None
    spec = parse_vllm_metrics(pages["eagle3-g0"]).spec
    assert spec is not None and eagle.engine.spec is not None
    assert spec.draft_tokens == eagle.engine.spec.draft_tokens == 3 * spec.drafts
    assert spec.accepted_tokens == sum(spec.accepted_per_pos)
    assert "vllm:num_requests_waiting_by_reason" in pages["eagle3-g0"]
    assert "vllm:spec_decode_num_accepted_tokens_total{" in pages["eagle3-g0"]


@pytest.mark.parametrize("prefix_cache", [True, False])
async def test_a_fleet_built_without_prefix_cache_prefills_a_repeated_prompt_again(
    book: PromptBook, prefix_cache: bool
) -> None:
    """Over HTTP (vLLM 0.26's per-request timing, simulated ms): the second of two identical
    4,000-character (1,000-token) prompts sent one after the other waits for its first token
    as long as the first did on a fleet built without the prefix cache, and the prompt's
    prefill (1,000 x the twin's 0.025 ms = 25 ms) less on one built with it."""
    profile = load_profile()
    [server] = build_fleet(
        profile, [["plain"]], book, Clock(FAST), version="0.26", prefix_cache=prefix_cache
    )
    assert server.engine.prefix_cache is prefix_cache
    body = {"model": "smollm2-twin", "prompt": "x" * 4000, "max_tokens": 2}
    ttft_ms = []
    transport = httpx.ASGITransport(server.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://s") as c:
        for _ in range(2):
            answer = (await c.post("/v1/completions", json=body)).json()
            assert answer["usage"]["prompt_tokens"] == 1000
            ttft_ms.append(answer["metrics"]["time_to_first_token_ms"])
    await server.engine.close()
    prefill_ms = 1000 * profile.kinds["plain"].cost.prefill_ms_per_token
    assert prefill_ms == pytest.approx(25.0)
    assert ttft_ms[0] > prefill_ms
    assert ttft_ms[1] == pytest.approx(ttft_ms[0] - (prefill_ms if prefix_cache else 0.0), abs=1e-3)


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"{not json", 400),
        (b"[1]", 400),
        (b'{"model": "other", "prompt": "x"}', 404),
        (b'{"prompt": "x", "max_tokens": 0}', 400),
        (b'{"prompt": "x", "temperature": "hot"}', 400),
        (b'{"prompt": "x", "n": 2}', 400),
        (b'{"max_tokens": 3}', 400),
    ],
)
async def test_bad_input_gets_vllms_error_envelope(
    book: PromptBook, body: bytes, status: int
) -> None:
    engine = Engine("p", load_profile().kinds["plain"], Gpu(Clock(FAST)))
    app = create_sim_app(engine, book, version="0.26")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://s") as c:
        r = await c.post("/v1/completions", content=body)
    assert r.status_code == status
    assert r.json()["error"]["code"] == status


def test_the_openai_sdk_streams_from_a_served_simulator() -> None:
    profile = load_profile()
    from bench.workloads import Item

    item = Item("rag", "rag-x", "/v1/chat/completions", {}, 10)
    item = replace(item, body={"messages": [{"role": "user", "content": "Context: ..."}]})
    book = book_for(profile, [item])
    app = build_fleet(profile, [["ngram"]], book, Clock(FAST))[0].app
    with running_server(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        stream = client.chat.completions.create(
            model="smollm2-twin",
            messages=[{"role": "user", "content": "Context: ..."}],
            max_tokens=16,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        assert chunks[-1].usage is not None
        assert 1 <= chunks[-1].usage.completion_tokens <= 16
        assert client.models.list().data[0].id == "smollm2-twin"
        assert httpx.get(url + "/health").status_code == 200


def test_the_fleet_config_is_the_twins_rules_over_every_simulated_backend() -> None:
    from bench.sim.fleet import fleet_config
    from contracts.config import load_config, parse_config

    names = {f"{k}-g{g}": k for g in range(3) for k in ("plain", "ngram", "eagle3")}
    data = fleet_config(
        names, {n: f"http://127.0.0.1:{9300 + i}" for i, n in enumerate(names)}, True
    )
    config = parse_config(data, "sim-fleet")
    assert config.routing.policy == "adaptive"
    assert config.pools["plain"] == ["plain-g0", "plain-g1", "plain-g2"]
    assert len(config.pools["speculative"]) == 6
    eagle = config.backends["eagle3-g2"]
    assert eagle.compute_group == "gpu2"
    twin = load_config("config/gpu-twin.yaml")
    for kind in ("eagle3", "ngram"):  # the twin config's own per-backend settings
        sim = config.backends[f"{kind}-g2"]
        assert sim.min_acceptance_rate == twin.backends[kind].min_acceptance_rate
    # ngram's batch limit is the twin config's; EAGLE-3's the H200 fleet's, not the H100's
    assert config.backends["ngram-g2"].max_batch_for_speculation == 1
    assert twin.backends["ngram"].max_batch_for_speculation == 1
    assert config.backends["eagle3-g2"].max_batch_for_speculation == 4
    assert twin.backends["eagle3"].max_batch_for_speculation == 16
    assert [r.name for r in config.rules] == [r.name for r in twin.rules]  # the twin's rules
    static = fleet_config(names, {n: "http://x" for n in names}, True, policy="static")
    assert parse_config(static, "sim-fleet").routing.policy == "static"  # --static's gateway
    assert static["rules"] == data["rules"] and static["backends"] == {
        n: b | {"url": "http://x"} for n, b in data["backends"].items()
    }
    without = fleet_config(names, {n: "http://x" for n in names}, False)
    assert all("compute_group" not in b for b in without["backends"].values())


def test_a_fleet_wave_arrives_in_an_order_that_does_not_cycle_through_the_tasks() -> None:
    """bench.sim_fleet sends each wave shuffled (the same order to every target): the
    sample's code, rag, chat, creative cycle dealt round robin over 8 servers gave each
    server one task (session 16); shuffled, every server of 8 gets more than one, and the
    wave keeps its items."""
    from bench.workloads import Item, arrival_order

    tasks = ("code", "rag", "chat", "creative")
    wave = [Item(t, f"{t}-{i}", "/v1/chat/completions", {}, 10) for i in range(64) for t in tasks]
    order = arrival_order(wave, seed=0)
    assert sorted(i.id for i in order) == sorted(i.id for i in wave)
    assert order == arrival_order(wave, seed=0)  # every target gets the same order
    assert all(len({i.task for i in order[s::8]}) > 1 for s in range(8))
    assert all(len({i.task for i in wave[s::8]}) == 1 for s in range(8))  # as it was


async def test_calibration_replays_a_per_task_run_at_its_concurrencies_only() -> None:
    """``--against`` a per-task run (session 33) replays one task a wave, and only at that
    run's concurrencies (a replay of every c took minutes for cells never compared)."""
    from bench.workloads import Item

    tasks = ("code", "rag", "chat", "creative")
    items = [
        Item(t, f"{t}-{i}", "/v1/chat/completions", {"messages": [{"content": f"{t} {i}"}]}, 400)
        for t in tasks
        for i in range(2)
    ]
    cells = await sim_calibrate.replay(load_profile(), items, FAST, [2], "per-task")
    assert set(cells) == {"plain", "ngram", "eagle3"}
    assert all(list(by) == [2] and set(by[2]) == set(tasks) for by in cells.values())
    assert all(v > 0 for by in cells.values() for v in by[2].values())
