"""Live scoring: the distribution canary reads the token ids of live sampled requests sent to
speculative backends (fakes sampling from the toy target model), strips them from the
client's answer unless asked for, scores them off the request path into the canary's test,
and takes a faulty backend off sampled traffic, within its token budget."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from bench.toy_lm import ToyLM
from gateway.trace import RequestTrace
from gateway.upstream.live_ids import IdsTap, qualifies, strip_token_ids, with_token_ids
from gateway.upstream.live_scoring import LiveScorer, LiveScoringBudget
from gateway.upstream.sample_canary import SampleCanary
from tests.unit.conftest import MODEL, InProcess, static_config

LM = ToyLM()
CODE = {"x-task-type": "code"}  # static rules: code at T <= 0.6 goes to ngram, draft, eagle3


def compact(obj: Any) -> bytes:
    """JSON as vLLM's ``JSONResponse`` writes it (Starlette: compact, UTF-8)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def test_ids_stripped_back_to_null_as_vllm_sends_them() -> None:
    choice = {"index": 0, "text": ' say "token_ids":[1,2]', "finish_reason": "length"}
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    plain = {"id": "c", "choices": [choice | {"token_ids": None, "prompt_token_ids": None}]}
    asked = {"id": "c", "choices": [choice | {"token_ids": [7, 8], "prompt_token_ids": [1, 2, 3]}]}
    body, prompt, ids = strip_token_ids(compact(asked | {"usage": usage}), keep=False)
    assert body == compact(plain | {"usage": usage}) and prompt == [1, 2, 3] and ids == [7, 8]
    kept, prompt, ids = strip_token_ids(compact(asked), keep=True)
    assert kept == compact(asked) and ids == [7, 8]
    # chat: prompt ids top-level, after the choices
    chat = {"choices": [{"message": {"content": "hi"}, "token_ids": [5]}], "prompt_token_ids": [4]}
    body, prompt, ids = strip_token_ids(compact(chat), keep=False)
    assert json.loads(body)["prompt_token_ids"] is None and (prompt, ids) == ([4], [5])
    two = {"choices": [{"token_ids": [1]}, {"token_ids": [2]}], "prompt_token_ids": [4]}
    assert strip_token_ids(compact(two), keep=False)[1:] == (None, None)  # n > 1: not read


def test_flag_spliced_into_the_clients_bytes() -> None:
    raw = b'{"model": "m", "prompt": "caf\xc3\xa9"}'
    assert with_token_ids(raw) == b'{"return_token_ids":true,"model": "m", "prompt": "caf\xc3\xa9"}'
    assert with_token_ids('{"a": 1}'.encode("utf-16")) is None


def sse(events: list[Any]) -> bytes:
    """A vLLM event stream: ``data: <compact JSON>`` events, then ``[DONE]``."""
    return b"".join(b"data: " + compact(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def chat_stream(asked: bool) -> bytes:
    """A chat stream as vLLM sends it with and without ``return_token_ids``: the role
    chunk (prompt ids top-level), content chunks, one step whose text the detokenizer held
    back (sent only when ids are asked for), the terminal chunk, usage."""
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}

    def step(delta: dict[str, Any], ids: list[int], finish: str | None = None) -> Any:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return head | {"choices": [choice | {"token_ids": ids if asked else None}]}

    role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
            "finish_reason": None}  # fmt: skip
    events = [head | {"choices": [role], "prompt_token_ids": [1, 2, 3] if asked else None}]
    events += [step({"content": "caf"}, [7])]
    if asked:
        events += [step({}, [8])]  # "é" split over two tokens: held back
    events += [step({"content": "é!"}, [9]), step({}, [10], "stop") | {"usage": None}]
    events += [head | {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}]
    return sse(events)


def completion_stream(asked: bool) -> bytes:
    head = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m"}
    events = []
    for i, (text, ids) in enumerate([("a", [7]), (" b", [8, 9]), (" c", [10])]):
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": None,
                  "prompt_token_ids": [1, 2] if asked and i == 0 else None,
                  "token_ids": ids if asked else None}  # fmt: skip
        events.append(head | {"choices": [choice]})
    return sse(events)


@pytest.mark.parametrize(
    ("stream", "path", "prompt", "ids"),
    [
        (chat_stream, "/v1/chat/completions", [1, 2, 3], [7, 8, 9, 10]),
        (completion_stream, "/v1/completions", [1, 2], [7, 8, 9, 10]),
    ],
)
@pytest.mark.parametrize("cut", [1, 7, 64, 10_000])
def test_stream_ids_read_and_the_client_gets_the_unasked_stream(
    stream: Callable[[bool], bytes], path: str, prompt: list[int], ids: list[int], cut: int
) -> None:
    got: list[tuple[list[int], list[int]]] = []
    trace = RequestTrace("r", path, True)
    flagged = stream(True)
    for keep, expected in ((False, stream(False)), (True, flagged)):
        tap = IdsTap(trace, None, keep=keep, sink=lambda _t, p, i: got.append((p, i)))
        out = b"".join(tap.feed(flagged[i : i + cut]) for i in range(0, len(flagged), cut))
        assert out + tap.close() == expected
    assert got == [(prompt, ids), (prompt, ids)]


@pytest.mark.parametrize(
    ("extra", "ok"),
    [
        ({}, True),
        ({"top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 3, "stop": ["\n"]}, True),
        ({"presence_penalty": 0, "repetition_penalty": 1.0, "n": 1}, True),
        ({"return_token_ids": True}, True),
        ({"return_token_ids": False}, False),
        ({"stream": True, "stream_options": {"include_usage": True}}, True),
        ({"n": 2}, False),
        ({"presence_penalty": 0.5}, False),
        ({"repetition_penalty": 1.1}, False),
        ({"logit_bias": {"42": 5}}, False),
        ({"response_format": {"type": "json_object"}}, False),
        ({"structured_outputs": {"regex": "a+"}}, False),
        ({"min_tokens": 8}, False),
        ({"echo": True}, False),
    ],
)
def test_only_plain_temperature_sampling_qualifies(extra: dict[str, Any], ok: bool) -> None:
    assert qualifies({"model": MODEL, "prompt": "x", "temperature": 0.5} | extra) is ok


def test_chat_needs_text_messages() -> None:
    text = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    assert qualifies({"messages": text}) and not qualifies({"messages": image})
    assert not qualifies({"prompt": ["a", "b"]}) and qualifies({"prompt": [1, 2, 3]})


def scorer_of(gw: InProcess) -> tuple[LiveScorer, SampleCanary, list[float]]:
    """The app's live scorer on a clock the test moves (unix seconds), with the fakes
    sampling from the toy model."""
    runtime = gw.app.state.runtime
    runtime.gateway.reload(static_config())
    for name, fake in gw.fakes.items():
        fake.lm, fake.seed = LM, hash(name) % 1000
    scorer: LiveScorer = runtime.live_scoring
    now = [1_000_000.0]
    scorer.clock = runtime.sample_canary.clock = lambda: now[0]
    return scorer, runtime.sample_canary, now


async def until_scored(scorer: LiveScorer, timeout_s: float = 10.0) -> None:
    """Wait until the worker (the app's background task) scored everything queued."""
    async with asyncio.timeout(timeout_s):
        await scorer.queue.join()


async def complete(gw: InProcess, **extra: Any) -> Any:
    body = {"model": MODEL, "prompt": "def f():", "max_tokens": 32, "temperature": 0.5} | extra
    resp = await gw.client.post("/v1/completions", json=body, headers=CODE)
    assert resp.status_code == 200
    return resp


async def test_ids_asked_stripped_and_scored_into_the_canarys_test(gw: InProcess) -> None:
    scorer, canary, _ = scorer_of(gw)
    resp = await complete(gw)
    backend = resp.headers["x-specgate-backend"]
    assert backend in {"ngram", "draft", "eagle3"}
    choice = resp.json()["choices"][0]
    assert choice["token_ids"] is None and choice["prompt_token_ids"] is None  # as asked
    sent = json.loads(gw.fakes[backend].received[-1]["body"])
    assert sent["return_token_ids"] is True
    await until_scored(scorer)
    scored = [json.loads(r["body"]) for r in gw.fakes["plain"].received]
    assert len(scored) == 1 and scored[0]["prompt_logprobs"] == 0 and scored[0]["max_tokens"] == 1
    assert len(scored[0]["prompt"]) == 2 + 32  # the toy's prompt ids + the sampled ids
    stream = canary.streams[(backend, "(0, 0.6]")]
    assert stream.counts() == (32, 0) and stream.verdict == "pass"
    assert stream.alpha == canary.alpha(scorer.bands(), live=True)
    view = (await gw.client.get("/routes")).json()["sample_canary"]
    assert view["live"]["counts"]["scored"] == 1
    assert view["live"]["budget"] == {"tokens_per_minute": 2000.0, "queue": 64,
                                      "judge_interval_s": 60.0}  # fmt: skip
    assert view["cost_last_hour"]["live_scored_tokens"] == 34
    metrics = (await gw.client.get("/metrics")).text
    assert 'specgate_sample_canary_tokens_last_hour{kind="live_scored"} 34.0' in metrics

    kept = (await complete(gw, return_token_ids=True)).json()["choices"][0]
    assert len(kept["token_ids"]) == 32 and len(kept["prompt_token_ids"]) == 2
    greedy = await complete(gw, temperature=0)
    assert "return_token_ids" not in json.loads(
        gw.fakes[greedy.headers["x-specgate-backend"]].received[-1]["body"]
    )
    await until_scored(scorer)
    assert scorer.counts["scored"] == 2


def test_live_judgements_are_counted_in_the_level(gw: InProcess) -> None:
    scorer, canary, _ = scorer_of(gw)
    bands = scorer.bands()
    streams = sum(len(b) for b in bands.values())
    per_round = max(sum(band in bs for bs in bands.values()) for band in bands["ngram"])
    # rounds and live judgements spend half of alpha_hour each, both tested with the plain bound
    assert canary.alpha(bands) == pytest.approx(1e-3 / 2 / (2 * 12 * per_round))
    assert canary.alpha(bands, live=True) == pytest.approx(1e-3 / 2 / (2 * 60 * streams))
    canary.live_judgements_per_hour = 0.0  # live scoring off: the rounds spend it all
    assert canary.alpha(bands) == pytest.approx(1e-3 / (2 * 12 * per_round))


async def test_faulty_backend_taken_off_sampled_traffic(gw: InProcess) -> None:
    scorer, canary, now = scorer_of(gw)
    states = gw.app.state.runtime.gateway.registry.states
    gw.fakes["ngram"].sample_fault = 0.25
    seen: set[str] = set()
    while len(seen) < 3:  # until each speculative backend answered
        seen.add((await complete(gw)).headers["x-specgate-backend"])
    await until_scored(scorer)
    now[0] += 60
    scorer.judge_due()
    reason = states["ngram"].sample_suspect
    assert reason is not None and "at temperature (0, 0.6]" in reason
    assert states["draft"].sample_suspect is None and states["eagle3"].sample_suspect is None
    evidence = canary.streams[("ngram", "(0, 0.6]")].evidence[-1]
    assert evidence.prompt == -1 and evidence.request and evidence.logprob < -25
    assert evidence.temperature == 0.5
    served = {(await complete(gw)).headers["x-specgate-backend"] for _ in range(8)}
    assert served == {"draft", "eagle3"}
    page = (await gw.client.get("/status")).text
    assert f"live request {evidence.request}" in page
    assert "Live traffic: up to 2000 scored tokens a minute per speculative backend" in page


def trace_on(backend: str) -> RequestTrace:
    trace = RequestTrace("r", "/v1/completions", False)
    trace.backend = backend
    return trace


async def test_budget_and_queue_respected(gw: InProcess) -> None:
    runtime = gw.app.state.runtime
    runtime.gateway.reload(static_config())
    t = [0.0]
    scorer = LiveScorer(
        runtime.sample_canary,
        LiveScoringBudget(tokens_per_minute=100, queue=1000),
        monotonic=lambda: t[0],
    )
    body: dict[str, Any] = {"model": MODEL, "prompt": "x", "temperature": 0.5}
    charged = 0
    for _ in range(600):  # 10 minutes, a 30-token request a second
        t[0] += 1
        taken = scorer.attach("/v1/completions", body, b"{}", "ngram", trace_on("ngram"))
        if taken is not None:
            wrap: Callable[[Any], Any] = taken[1]
            tap = wrap(None)
            answer = {"choices": [{"token_ids": list(range(20)), "prompt_token_ids": [1] * 10}]}
            tap.feed(compact(answer))
            assert json.loads(tap.close())["choices"][0]["token_ids"] is None
            charged += 30
    assert 1000 <= charged <= 100 * 10 + 100 + 30  # the rate, a full bucket, one request
    assert scorer.counts["over_budget"] > 0 and scorer.queue.qsize() == charged // 30
    full = LiveScorer(runtime.sample_canary, LiveScoringBudget(queue=2))
    for _ in range(5):
        full.offer(trace_on("ngram"), 0.5, [1], [2, 3])
    full.offer(trace_on("plain"), 0.5, [1], [2, 3])
    assert full.counts["dropped_queue_full"] == 3 and full.counts["not_speculative"] == 1
    assert scorer.attach("/v1/completions", body, b"{}", "plain", trace_on("plain")) is None


async def test_a_sampled_stream_is_asked_for_its_ids(gw: InProcess) -> None:
    scorer, _, _ = scorer_of(gw)
    body = {"model": MODEL, "prompt": "def f():", "max_tokens": 4, "temperature": 0.5,
            "stream": True}  # fmt: skip
    resp = await gw.client.post("/v1/completions", json=body, headers=CODE)
    assert resp.status_code == 200 and resp.text.rstrip().endswith("data: [DONE]")
    sent = json.loads(gw.fakes[resp.headers["x-specgate-backend"]].received[-1]["body"])
    assert sent["return_token_ids"] is True and sent["stream"] is True
    assert scorer.counts["asked"] == 1  # this fake sends no ids: nothing to score
