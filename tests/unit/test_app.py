"""The gateway app in process, against fake vLLM backends: routing headers, pass-through,
error envelopes, failover, admin views."""

from __future__ import annotations

import json

import pytest

from tests.unit.conftest import MODEL, InProcess, gateway_settings, in_process, static_config

CODE = {"model": MODEL, "prompt": "def fib(n):\n    ", "max_tokens": 8, "temperature": 0}


def assert_envelope(resp, status: int, code: str | None = None) -> dict:  # type: ignore[no-untyped-def]
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    if code is not None:
        assert error["code"] == code
    return error


async def test_completion_is_routed_and_forwarded_byte_for_byte(gw: InProcess) -> None:
    raw = json.dumps(CODE | {"top_k": 5, "return_token_ids": True, "priority": 1}).encode()
    resp = await gw.client.post(
        "/v1/completions",
        content=raw,
        headers={"content-type": "application/json", "x-task-type": "code"},
    )
    assert resp.status_code == 200
    backend = resp.headers["x-specgate-backend"]
    assert backend in {"eagle3", "ngram", "draft"}
    assert resp.headers["x-specgate-rule"] == "code-rag-speculative"
    assert resp.headers["x-specgate-task"] == "code"
    assert resp.json()["served_by"] == backend
    [received] = gw.fakes[backend].received
    assert received["body"] == raw
    assert received["path"] == "/v1/completions"


async def test_creative_goes_to_plain(gw: InProcess) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": 1.0}
    resp = await gw.client.post(
        "/v1/chat/completions", json=body, headers={"x-task-type": "creative"}
    )
    assert resp.headers["x-specgate-backend"] == "plain"
    assert resp.headers["x-specgate-rule"] == "creative-plain"


async def test_stream_is_relayed_as_sse(gw: InProcess) -> None:
    body = CODE | {"stream": True, "stream_options": {"include_usage": True}}
    resp = await gw.client.post("/v1/completions", json=body, headers={"x-task-type": "code"})
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = [e for e in resp.text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    texts = [json.loads(e.removeprefix("data: "))["choices"][0]["text"] for e in events[:-1]]
    assert "".join(texts) == " w0 w1 w2 w3 w4 w5 w6 w7"


async def test_credentials_are_not_forwarded_and_request_id_round_trips(gw: InProcess) -> None:
    resp = await gw.client.post(
        "/v1/completions",
        json=CODE,
        headers={
            "authorization": "Bearer client-secret",
            "x-request-id": "req-42",
            "x-task-type": "chat",
            "connection": "keep-alive",
        },
    )
    assert resp.headers["x-request-id"] == "req-42"
    [received] = gw.fakes["plain"].received
    assert "authorization" not in received["headers"]
    assert received["headers"]["x-request-id"] == "req-42"
    generated = await gw.client.post("/v1/completions", json=CODE)
    assert len(generated.headers["x-request-id"]) == 32


async def test_errors_answered_by_the_gateway_carry_the_request_id(gw: InProcess) -> None:
    """The gateway's own refusals (400, 404 for an unknown model or path, 405, 413;
    Anthropic's envelope on ``/v1/messages``) carry ``x-request-id`` as its relayed answers
    do: the client's, else one the gateway made."""
    bad = await gw.client.post(
        "/v1/completions", content=b"{not json", headers={"x-request-id": "req-7"}
    )
    assert_envelope(bad, 400)
    assert bad.headers["x-request-id"] == "req-7"
    unknown = await gw.client.post("/v1/completions", json={"model": "nope", "prompt": "x"})
    assert unknown.status_code == 404 and len(unknown.headers["x-request-id"]) == 32
    large = await gw.client.post("/v1/completions", content=b"x" * (65 * 1024))
    assert large.status_code == 413 and len(large.headers["x-request-id"]) == 32
    messages = await gw.client.post("/v1/messages", content=b"{", headers={"x-request-id": "req-8"})
    assert messages.status_code == 400 and messages.headers["x-request-id"] == "req-8"
    # the router's own refusals too: a method a routed path does not take, an unknown path
    wrong = await gw.client.get("/v1/completions", headers={"x-request-id": "req-9"})
    assert wrong.status_code == 405 and wrong.headers["x-request-id"] == "req-9"
    nowhere = await gw.client.post("/v1/nowhere", json={})
    assert nowhere.status_code == 404 and len(nowhere.headers["x-request-id"]) == 32
    # a UTF-8 id comes back as the same bytes, refused or relayed
    raw = "idé-日本".encode()
    for content in (b"{not json", json.dumps(CODE).encode()):
        resp = await gw.client.post(
            "/v1/completions", content=content, headers={b"x-request-id": raw}
        )
        assert dict(resp.headers.raw)[b"x-request-id"] == raw


@pytest.mark.parametrize(
    "content", [b"{not json", b"\xff\xfe{}", b"[1, 2]", b"[" * 50_000, b'"a string"']
)
async def test_bodies_that_are_no_json_object_get_400(gw: InProcess, content: bytes) -> None:
    resp = await gw.client.post("/v1/completions", content=content)
    assert_envelope(resp, 400)
    assert not any(f.received for f in gw.fakes.values())


async def test_json_nested_too_deeply_is_named_as_such(gw: InProcess) -> None:
    """Well-formed JSON nested past Python's recursion limit: a 400 that says why, not
    "not valid JSON" (it is valid)."""
    deep = b'{"model": "%s", "prompt": %s}' % (MODEL.encode(), b"[" * 5000 + b"]" * 5000)
    resp = await gw.client.post("/v1/completions", content=deep)
    assert_envelope(resp, 400)
    assert resp.json()["error"]["message"] == (
        "The request body nests JSON arrays or objects too deeply."
    )
    assert not any(f.received for f in gw.fakes.values())


@pytest.mark.parametrize(
    "body",
    [
        {"model": MODEL, "prompt": "x", "temperature": "hot"},
        {"model": MODEL, "prompt": "x", "temperature": "nan"},
        {"model": MODEL, "prompt": "x", "stream": "maybe"},
        {"prompt": "x"},
        {"model": 7, "prompt": "x"},
        {"model": MODEL},
    ],
)
async def test_unreadable_fields_route_with_defaults_and_the_backend_judges(
    gw: InProcess, body: dict
) -> None:
    """Never stricter than vLLM: what the gateway cannot read goes to the backend as sent."""
    raw = json.dumps(body).encode()
    resp = await gw.client.post("/v1/completions", content=raw)
    assert resp.status_code == 200
    [received] = [r for f in gw.fakes.values() for r in f.received]
    assert received["body"] == raw


async def test_lax_fields_are_read_as_vllm_reads_them(gw: InProcess) -> None:
    """``"temperature": "0.2"`` is 0.2 (pydantic lax mode, as vLLM's request models)."""
    body = {"model": MODEL, "prompt": "def add(a, b):", "temperature": "0.2"}
    resp = await gw.client.post("/v1/completions", json=body)
    assert resp.status_code == 200
    assert resp.headers["x-specgate-rule"] == "code-rag-speculative"
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": "0.2"}
    resp = await gw.client.post("/v1/chat/completions", json=chat | {"stream": "true"})
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")


async def test_unknown_model_is_404(gw: InProcess) -> None:
    resp = await gw.client.post("/v1/completions", json=CODE | {"model": "gpt-9"})
    assert assert_envelope(resp, 404, "model_not_found")["param"] == "model"


async def test_body_over_the_limit_is_413(gw: InProcess) -> None:
    resp = await gw.client.post("/v1/completions", json=CODE | {"prompt": "x" * 70_000})
    assert_envelope(resp, 413, "request_too_large")


async def test_backend_4xx_passes_through_unchanged(gw: InProcess) -> None:
    gw.fakes["plain"].status = 400
    resp = await gw.client.post("/v1/completions", json=CODE, headers={"x-task-type": "chat"})
    assert resp.status_code == 400
    assert resp.json()["error"]["message"] == "fake 400"
    assert resp.headers["x-specgate-backend"] == "plain"


async def test_503_fails_over_then_all_down_is_503() -> None:
    # one attempt per local backend: the three speculative ones, then plain
    async with in_process(gateway_settings(max_attempts=4)) as gw:
        gw.fakes["eagle3"].status = 503
        gw.fakes["ngram"].status = 503
        gw.fakes["draft"].status = 502
        code = {"x-task-type": "code"}
        resp = await gw.client.post("/v1/completions", json=CODE, headers=code)
        assert resp.status_code == 200
        assert resp.headers["x-specgate-backend"] == "plain"
        gw.fakes["plain"].status = 503
        resp = await gw.client.post("/v1/completions", json=CODE, headers=code)
        assert_envelope(resp, 503, "no_healthy_backend")
        routes = (await gw.client.get("/routes")).json()
        assert routes["decisions"]["failovers"] == 7  # 3 to reach plain, then all 4 down


async def test_models_health_ready_routes(gw: InProcess) -> None:
    models = (await gw.client.get("/v1/models")).json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert (await gw.client.get("/health")).json() == {"status": "ok"}
    ready = (await gw.client.get("/ready")).json()
    assert sorted(ready["healthy_backends"]) == ["draft", "eagle3", "ngram", "plain"]
    await gw.client.post("/v1/completions", json=CODE, headers={"x-task-type": "code"})
    routes = (await gw.client.get("/routes")).json()
    assert [b["name"] for b in routes["backends"]] == ["plain", "ngram", "draft", "eagle3"]
    assert routes["backends"][1]["speculation"]["method"] == "ngram"
    assert routes["backends"][3]["speculation"]["method"] == "eagle3"
    assert routes["decisions"]["by_rule"] == {"code-rag-speculative": 1}
    assert sum(routes["decisions"]["by_backend"].values()) == 1
    assert [r["name"] for r in routes["rules"]][-1] == "default"


async def test_the_backends_catalog_is_read_before_the_app_is_ready(gw: InProcess) -> None:
    """A client's first ``/v1/models`` reads nothing upstream: startup read every backend's
    ``/openapi.json`` and ``/v1/models`` (the first one waited 2.0-3.0 s on the CPU stack)."""
    catalog = gw.app.state.runtime.catalog
    for name in ("plain", "ngram", "draft", "eagle3"):
        assert [card["id"] for card in catalog.cards(name)] == [MODEL]
        assert "/v1/completions" in [t.template for t in catalog.paths(name)]


async def test_unknown_route_and_method_use_the_envelope(gw: InProcess) -> None:
    assert_envelope(await gw.client.get("/v1/nothing"), 404)
    assert_envelope(await gw.client.get("/v1/completions"), 405)


def queue_metrics(running: int, waiting: int) -> str:
    return (
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{engine="0"}} {running}.0\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{engine="0"}} {waiting}.0\n'
    )


async def test_long_queue_moves_low_temperature_code_to_plain(gw: InProcess) -> None:
    for name in ("eagle3", "ngram", "draft"):
        gw.fakes[name].metrics_text = queue_metrics(running=4, waiting=12)
    await gw.poll()
    routes = (await gw.client.get("/routes")).json()
    loads = {b["name"]: b["load"] for b in routes["backends"]}
    assert loads["ngram"]["waiting"] == 12 and loads["ngram"]["running"] == 4
    # none of them ours, and no answer of ours there to age them by: counted as scraped
    assert loads["ngram"]["other_clients"] == 16 and loads["ngram"]["request_duration_s"] == 0
    for _ in range(5):
        resp = await gw.client.post("/v1/completions", json=CODE, headers={"x-task-type": "code"})
        assert resp.headers["x-specgate-backend"] == "plain"
        assert resp.headers["x-specgate-rule"] == "code-rag-speculative"
    explained = (await gw.client.post("/routes/explain", json=CODE | {"prompt": "def f():"})).json()
    why = {c["backend"]: c["why"] for c in explained["candidates"] if not c["kept"]}
    for name in ("eagle3", "ngram", "draft"):  # the compute group's batch: 3 x (4 + 12)
        assert why[name] == "batch 48 > max_batch_for_speculation 4: speculation loses"
    [plain] = [
        b for b in (await gw.client.get("/routes")).json()["backends"] if b["name"] == "plain"
    ]
    assert plain["load"]["request_duration_s"] > 0  # our 5 answers there, timed
    # the queue drains: speculation is back
    for name in ("eagle3", "ngram", "draft"):
        gw.fakes[name].metrics_text = queue_metrics(running=1, waiting=0)
    await gw.poll()
    resp = await gw.client.post("/v1/completions", json=CODE, headers={"x-task-type": "code"})
    assert resp.headers["x-specgate-backend"] in {"eagle3", "ngram", "draft"}


async def test_unreachable_metrics_keep_previous_figures(gw: InProcess) -> None:
    gw.fakes["ngram"].metrics_text = queue_metrics(running=2, waiting=1)
    await gw.poll()
    gw.fakes["ngram"].metrics_text = "this is { not prometheus"
    await gw.poll()
    routes = (await gw.client.get("/routes")).json()
    [ngram] = [b for b in routes["backends"] if b["name"] == "ngram"]
    assert ngram["load"]["running"] == 2 and ngram["healthy"] is True


def spec_metrics(drafts: int, accepted: int, k: int = 3) -> str:
    lines = []
    for name, value in (
        ("drafts", drafts),
        ("draft_tokens", drafts * k),
        ("accepted_tokens", accepted),
    ):
        lines.append(f"# TYPE vllm:spec_decode_num_{name} counter")
        lines.append(f'vllm:spec_decode_num_{name}_total{{engine="0"}} {value}.0')
    return "\n".join(lines) + "\n"


async def test_low_acceptance_demotes_then_recovery_restores(gw: InProcess) -> None:
    gw.app.state.runtime.gateway.reload(static_config())  # the rules' demotion, without learning
    gw.fakes["draft"].metrics_text = spec_metrics(drafts=0, accepted=0)
    gw.fakes["ngram"].metrics_text = spec_metrics(drafts=0, accepted=0, k=5)
    gw.fakes["eagle3"].metrics_text = spec_metrics(drafts=0, accepted=0)
    await gw.poll()
    gw.fakes["draft"].metrics_text = spec_metrics(drafts=300, accepted=9)  # 1% acceptance
    gw.fakes["ngram"].metrics_text = spec_metrics(drafts=100, accepted=150, k=5)  # 30%
    gw.fakes["eagle3"].metrics_text = spec_metrics(drafts=100, accepted=210)  # 70%
    await gw.poll()
    routes = {b["name"]: b for b in (await gw.client.get("/routes")).json()["backends"]}
    assert routes["draft"]["acceptance"]["rate"] == pytest.approx(0.01)
    assert routes["draft"]["acceptance"]["mean_length"] == pytest.approx(1.03)
    assert routes["draft"]["demoted"] is True and routes["draft"]["demotions"] == 1
    assert routes["ngram"]["demoted"] is False  # 0.30 >= its floor of 0.15
    assert routes["eagle3"]["demoted"] is False  # 0.70 >= the default floor of 0.5
    served = []
    for _ in range(40):
        resp = await gw.client.post("/v1/completions", json=CODE, headers={"x-task-type": "code"})
        served.append(resp.headers["x-specgate-backend"])
    # the two kept backends share the traffic; draft keeps only its probe share
    assert served.count("ngram") + served.count("eagle3") >= 35
    assert served.count("ngram") > 0 and served.count("eagle3") > 0
    gw.fakes["draft"].metrics_text = spec_metrics(drafts=600, accepted=909)  # recovers
    await gw.poll()
    routes = {b["name"]: b for b in (await gw.client.get("/routes")).json()["backends"]}
    assert routes["draft"]["demoted"] is False


async def test_lone_surrogate_in_the_prompt_is_forwarded_not_a_500(gw: InProcess) -> None:
    raw = b'{"model": "smollm2-135m-instruct", "prompt": "\\ud800 hi", "max_tokens": 2}'
    resp = await gw.client.post("/v1/completions", content=raw)
    assert resp.status_code == 200  # the backend decides what to make of it
    assert any(r["body"] == raw for f in gw.fakes.values() for r in f.received)
    explained = await gw.client.post("/routes/explain", content=raw)
    assert explained.status_code == 200


async def test_unexpected_error_is_a_500_envelope_and_frees_the_slot(
    gw: InProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway = gw.app.state.runtime.gateway

    def broken(*_args: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(gateway, "decide", broken)  # a bug in the routing step
    resp = await gw.client.post("/v1/completions", json=CODE)
    assert_envelope(resp, 500, "internal_error")
    assert "bug" not in resp.text  # no traceback or detail leaks
    assert gateway.inflight == 0


async def test_other_methods_on_routed_endpoints_get_405(gw: InProcess) -> None:
    resp = await gw.client.get("/v1/chat/completions")
    assert_envelope(resp, 405)
    assert resp.headers["allow"] == "POST"
