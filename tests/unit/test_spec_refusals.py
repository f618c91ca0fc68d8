"""Requests a speculative backend cannot serve go to the plain pool (issue #18, item 1)."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from contracts.config import GatewayConfig
from gateway.classify.features import RequestFeatures
from gateway.routing.policy import BackendSnapshot, RoutingPolicy
from gateway.settle import Settle
from gateway.speculation.spec_params import NEVER_REFUSED, SpecParams, refusal_message
from tests.unit.conftest import (
    MODEL,
    InProcess,
    gateway_settings,
    in_process,
    local_config,
    static_config,
)

CODE = {"model": MODEL, "prompt": "def add(a, b):", "temperature": 0, "max_tokens": 8}
CHAT = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Fix this Python: def f(x) return x"}],
    "temperature": 0.3,
}
#: config/local.yaml's speculative backends and their speculation methods.
METHODS = {"eagle3": "eagle3", "ngram": "ngram", "draft": "draft_model"}
VLLM_MESSAGE = (
    "The min_p and logit_bias sampling parameters are not yet supported with speculative decoding."
)


def refusing(gw: InProcess, *params: str) -> None:
    for name in METHODS:
        gw.fakes[name].refuses = params


@pytest.fixture
async def gw() -> AsyncIterator[InProcess]:
    """The gateway under ``policy: static``: these tests need the rules' speculative choice
    for a code prompt at temperature 0, which adaptive routing turns on measured speeds (a
    loaded machine's timings once drew plain and failed a test that expects speculation)."""
    async with in_process(gateway_settings(), static_config()) as gateway:
        yield gateway


def served(gw: InProcess) -> dict[str, int]:
    return {name: len(fake.received) for name, fake in gw.fakes.items() if fake.received}


# -- the knowledge, pure -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "refused"),
    [
        ({"logit_bias": {"13": -100}}, ("logit_bias",)),
        ({"min_p": 0.05}, ("min_p",)),
        ({"min_p": "0.05"}, ("min_p",)),  # read as vLLM reads it
        ({"min_p": 0}, ()),
        ({"min_p": 1e-6}, ()),  # vLLM's _SAMPLING_EPS
        ({"logit_bias": {}}, ()),
        ({"logit_bias": None}, ()),
        ({"min_p": "junk"}, ()),
        ({"trace_decode_token_ids": [1]}, ("trace_decode_token_ids",)),
    ],
)
def test_known_refusals(body: dict, refused: tuple[str, ...]) -> None:
    got = SpecParams().refused(body, set(METHODS.values()), "/v1/completions")
    assert got == ({m: refused for m in METHODS.values()} if refused else {})


def test_known_refusals_apply_to_the_endpoints_that_read_them() -> None:
    """vLLM's Responses and Messages request models have no min_p: there it is ignored."""
    assert SpecParams().refused({"min_p": 0.5}, {"ngram"}, "/v1/messages") == {}


def test_learning_from_a_backend_message() -> None:
    params = SpecParams()
    body = {"min_p": 0.1, "repetition_penalty": 1.2, "top_k": 0, "seed": 3}
    message = (
        "The repetition_penalty and top_k parameters are not supported with speculative decoding."
    )
    assert refusal_message(json.dumps({"error": {"message": message}})) == message
    assert params.named(body, message) == ("repetition_penalty",)
    params.learn("ngram", "/v1/chat/completions", params.named(body, message))
    assert params.refused(
        {"repetition_penalty": 1.1}, {"ngram", "draft_model"}, "/v1/chat/completions"
    ) == {"ngram": ("repetition_penalty",)}
    assert params.refused({"repetition_penalty": 1.1}, {"ngram"}, "/v1/completions") == {}
    assert params.snapshot()["learnt"] == {"ngram /v1/chat/completions": ["repetition_penalty"]}


TRACE_IDS = "trace_decode_token_ids is not supported with speculative decoding."
OTHER_WORDING = "Speculative decoding is not supported for n > 1."
LOGITS_PROCESSORS = (
    "Custom logits processors are not supported when speculative decoding is enabled."
)


def error(message: str) -> str:
    return json.dumps({"error": {"message": message, "type": "BadRequestError", "code": 400}})


@pytest.mark.parametrize(
    ("text", "refusal"),
    [
        (error(VLLM_MESSAGE), VLLM_MESSAGE),
        (json.dumps({"object": "error", "message": VLLM_MESSAGE}), VLLM_MESSAGE),  # older vLLM
        (error(f"Bad request. {TRACE_IDS}"), TRACE_IDS),  # the refusing sentence only
        (error(LOGITS_PROCESSORS), LOGITS_PROCESSORS),
        # a stream's ordinary chunk whose text (an echoed prompt, an answer) says it
        (
            json.dumps({"choices": [{"text": "error: not supported with speculative decoding"}]}),
            None,
        ),
        # a validation error quoting the client's own input back (pydantic's input_value)
        (
            error(
                "1 validation error for CompletionRequest\ntop_k\n  Input should be a valid "
                "integer [type=int_parsing, input_value='min_p is not supported with "
                "speculative decoding', input_type=str]"
            ),
            None,
        ),
        # another wording: retried on plain (learnt only if plain then serves it)
        (error(OTHER_WORDING), OTHER_WORDING),
        (error("The model `x` does not exist."), None),
        ("speculative decoding is not supported", None),  # no JSON error envelope
        ("[1, 2]", None),
        ("{", None),
    ],
)
def test_what_counts_as_a_refusal(text: str, refusal: str | None) -> None:
    assert refusal_message(text) == refusal


def test_the_fields_every_request_sets_are_never_learnt() -> None:
    """A refusal naming ``model`` or ``prompt`` (as a message quoting the request might)
    must not refuse every request."""
    params = SpecParams()
    body = {"model": MODEL, "prompt": "x", "stream": True, "top_k": 5}
    message = "model, prompt, stream and top_k are not supported with speculative decoding."
    assert params.named(body, message) == ("top_k",)
    params.learn("eagle3", "/v1/completions", params.named(body, message))
    assert params.refused({"model": MODEL, "prompt": "y"}, {"eagle3"}, "/v1/completions") == {}
    assert {"model", "prompt", "messages", "input", "stream"} <= NEVER_REFUSED


def test_policy_passes_over_refusing_methods_for_plain() -> None:
    config: GatewayConfig = local_config()
    refused = {"ngram": ("min_p",), "eagle3": ("min_p",)}
    features = RequestFeatures(MODEL, 0.0, True, "code", 1.0, "header", spec_refused=refused)
    state = {name: BackendSnapshot(healthy=True) for name in config.backends}
    decision = RoutingPolicy(config).decide(features, state, random.Random(0))
    assert decision.backends[0] == "draft"  # draft_model was not said to refuse
    features = RequestFeatures(
        MODEL,
        0.0,
        True,
        "code",
        1.0,
        "header",
        spec_refused={method: ("min_p",) for method in METHODS.values()},
    )
    decision = RoutingPolicy(config).decide(features, state, random.Random(0))
    assert decision.backends[0] == "plain"
    assert set(decision.backends[1:]) == set(METHODS)  # last resort only
    assert any("speculation refuses min_p" in reason for reason in decision.reasons)


# -- through the gateway -------------------------------------------------------------------


async def test_logit_bias_code_prompt_goes_to_plain(gw: InProcess) -> None:
    """The issue's example: code at temperature 0 with logit_bias, on /v1/completions."""
    refusing(gw, "min_p", "logit_bias")
    resp = await gw.client.post("/v1/completions", json=CODE | {"logit_bias": {"13": -100}})
    assert resp.status_code == 200
    assert resp.headers["x-specgate-backend"] == "plain"
    assert resp.headers["x-specgate-rule"] == "code-rag-speculative"
    assert served(gw) == {"plain": 1}
    routes = (await gw.client.get("/routes")).json()
    assert routes["decisions"]["speculation_refuses"]["passed_over"] == {"logit_bias": 1}


@pytest.mark.parametrize("stream", [False, True])
async def test_min_p_chat_goes_to_plain(gw: InProcess, stream: bool) -> None:
    refusing(gw, "min_p", "logit_bias")
    body = CHAT | {"min_p": 0.05, "stream": stream}
    resp = await gw.client.post("/v1/chat/completions", json=body, headers={"x-task-type": "code"})
    assert resp.status_code == 200
    assert resp.headers["x-specgate-backend"] == "plain"
    assert "error" not in resp.text


async def test_explain_says_why(gw: InProcess) -> None:
    resp = await gw.client.post(
        "/routes/explain", json={"body": CODE | {"min_p": 0.05}, "headers": {"X-Task-Type": "code"}}
    )
    decision = resp.json()
    assert decision["backend"] == "plain"
    whys = {c["backend"]: c["why"] for c in decision["candidates"] if not c["kept"]}
    assert whys["ngram"] == "ngram speculation refuses min_p"
    assert whys["draft"] == "draft_model speculation refuses min_p"
    assert whys["eagle3"] == "eagle3 speculation refuses min_p"


@pytest.mark.parametrize("stream", [False, True])
async def test_a_new_refusal_is_learnt_and_retried_on_plain(gw: InProcess, stream: bool) -> None:
    """A parameter no list names: the speculative backend's 400 (or a stream's error event)
    never reaches the client; the gateway retries on plain and routes there from then on."""
    refusing(gw, "repetition_penalty")
    body = CODE | {"repetition_penalty": 1.3, "stream": stream}
    resp = await gw.client.post("/v1/completions", json=body)
    assert resp.status_code == 200
    assert resp.headers["x-specgate-backend"] == "plain"
    assert "speculative decoding" not in resp.text
    first = served(gw)
    assert first["plain"] == 1 and sum(first.values()) == 2  # one speculative refusal
    routes = (await gw.client.get("/routes")).json()
    learnt = routes["decisions"]["speculation_refuses"]["learnt"]
    [refused_method] = [method for name, method in METHODS.items() if name in first]
    assert learnt == {f"{refused_method} /v1/completions": ["repetition_penalty"]}
    assert routes["decisions"]["by_backend"] == {"plain": 1}
    # the next ones go to another method (not known to refuse yet) or plain, never back
    for _ in range(3):
        resp = await gw.client.post("/v1/completions", json=body)
        assert resp.status_code == 200 and resp.headers["x-specgate-backend"] == "plain"
    total = served(gw)
    assert sum(total.values()) - total["plain"] <= 3  # each method refused at most once


@pytest.mark.parametrize("stream", [False, True])
async def test_client_text_about_speculative_decoding_is_no_refusal(
    gw: InProcess, stream: bool
) -> None:
    """An echoed prompt saying "speculative decoding error" is the answer's first chunk, not
    a refusal: the speculative backend's answer reaches the client and nothing is learnt."""
    body = CODE | {
        "prompt": "Fix this speculative decoding error in my code:",
        "echo": True,
        "stream": stream,
    }
    for _ in range(3):
        resp = await gw.client.post("/v1/completions", json=body)
        assert resp.status_code == 200
        assert resp.headers["x-specgate-backend"] in METHODS
        assert "speculative decoding error" in resp.text
    assert served(gw).get("plain") is None
    refuses = (await gw.client.get("/routes")).json()["decisions"]["speculation_refuses"]
    assert refuses["learnt"] == {} and refuses["refusals"] == 0
    on = {"x-specgate-speculation": "on"}
    resp = await gw.client.post("/v1/completions", json=CODE, headers=on)
    assert resp.status_code == 200 and resp.headers["x-specgate-backend"] in METHODS


async def test_a_400_every_backend_gives_teaches_nothing(gw: InProcess) -> None:
    """A refusal-worded 400 that plain repeats (vLLM's grammar errors quote the client's
    schema unquoted: "Invalid type: max_tokens is not supported with speculative decoding")
    is the request's fault, not speculation's: relayed, nothing learnt, the next ordinary
    request still reaches speculation."""
    refusing(gw, "max_tokens")
    gw.fakes["plain"].refuses = ("max_tokens",)
    for _ in range(3):
        resp = await gw.client.post("/v1/completions", json=CODE)
        assert resp.status_code == 400
        assert resp.headers["x-specgate-backend"] == "plain"
    refuses = (await gw.client.get("/routes")).json()["decisions"]["speculation_refuses"]
    assert refuses["learnt"] == {} and refuses["refusals"] == 3
    refusing(gw)
    gw.fakes["plain"].refuses = ()
    on = {"x-specgate-speculation": "on"}
    resp = await gw.client.post("/v1/completions", json=CODE, headers=on)
    assert resp.status_code == 200 and resp.headers["x-specgate-backend"] in METHODS


async def test_speculative_only_when_nothing_else_is_healthy(gw: InProcess) -> None:
    refusing(gw)  # these fakes would serve it (another vLLM version)
    gw.fakes["plain"].healthy = False
    await gw.poll()
    resp = await gw.client.post("/v1/completions", json=CODE | {"min_p": 0.05})
    assert resp.status_code == 200
    assert resp.headers["x-specgate-backend"] in set(METHODS)


async def test_refusal_without_another_backend_reaches_the_client(gw: InProcess) -> None:
    refusing(gw, "min_p")
    gw.fakes["plain"].healthy = False
    await gw.poll()
    resp = await gw.client.post("/v1/completions", json=CODE | {"min_p": 0.05})
    assert resp.status_code == 400
    assert refusal_message(resp.text) == VLLM_MESSAGE.replace("min_p and logit_bias", "min_p")


async def test_refused_attempt_is_not_traced_as_served(gw: InProcess) -> None:
    refusing(gw, "repetition_penalty")
    await gw.client.post("/v1/completions", json=CODE | {"repetition_penalty": 1.3})
    assert gw.app.state.runtime.gateway.inflight == 0
    metrics = (await gw.client.get("/metrics")).text
    lines = [line for line in metrics.splitlines() if line.startswith("specgate_requests_total{")]
    assert len(lines) == 1 and 'backend="plain"' in lines[0] and 'status="200"' in lines[0]
    assert json.dumps(VLLM_MESSAGE)  # the fake words it as vLLM does


async def test_a_failure_after_the_retry_ends_the_retried_backends_lease(
    gw: InProcess, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The retry's answer is Settle's to close: an error while it is judged (here the second
    look raises) must end plain's lease at once, not when the garbage collector finds the
    answer (a log handler keeping the traceback, as caplog does, would hold it forever)."""
    refusing(gw, "repetition_penalty")
    looks = 0
    real = Settle._refusal

    async def second_look_fails(self: Settle, upstream: Any) -> Any:
        nonlocal looks
        looks += 1
        if looks == 2:
            raise RuntimeError("a bug while judging the retried answer")
        return await real(self, upstream)

    monkeypatch.setattr(Settle, "_refusal", second_look_fails)
    resp = await gw.client.post("/v1/completions", json=CODE | {"repetition_penalty": 1.3})
    assert resp.status_code == 500 and resp.json()["error"]["type"]
    assert looks == 2 and "plain" in served(gw)
    states = gw.app.state.runtime.gateway.registry.states
    assert {name: s.inflight for name, s in states.items()} == dict.fromkeys(states, 0)
    assert gw.app.state.runtime.gateway.inflight == 0
