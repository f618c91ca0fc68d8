"""A stream that fails part-way ends with the error event of the API the client called:
Anthropic's ``event: error`` on ``/v1/messages``, OpenAI's ``data: {"error": ...}`` then
``data: [DONE]`` elsewhere (byte for byte what it always was).

Real sockets (the fakes drop the connection mid-stream, which in-process transports cannot
do), on each upstream engine; the events are read with ``httpx-sse``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from httpx_sse import ServerSentEvent, connect_sse

from contracts.config import parse_config
from gateway.app import create_app
from gateway.errors import anthropic_error_type, anthropic_path, stream_failure_event
from gateway.failures import BackendDied
from gateway.settings import Settings
from tests.fakes.fake_vllm import FakeBehaviour, create_fake_vllm
from tests.fakes.servers import running_server

MODEL = "smollm2-135m-instruct"
MESSAGES = {
    "model": MODEL,
    "max_tokens": 8,
    "stream": True,
    "messages": [{"role": "user", "content": "Say hi"}],
}
BROKE_OFF = "The backend failed while streaming the response."
#: What a chat or completions stream cut part-way has always ended with.
OPENAI_TAIL = (
    b'data: {"error": {"message": "The backend failed while streaming the response.", '
    b'"type": "server_error", "param": null, "code": "upstream_error"}}\n\ndata: [DONE]\n\n'
)


@dataclass
class Stack:
    url: str
    fake: FakeBehaviour


@pytest.fixture(params=["aiohttp", "httpx"])
def stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    """One fake behind a gateway on real sockets (a 0.3 s idle timeout), on each engine."""
    fake = FakeBehaviour(name="plain")
    with running_server(create_fake_vllm(fake)) as fake_url:
        config = parse_config(
            {
                "defaults": {"pool": "p"},
                "backends": {"plain": {"url": fake_url, "model": MODEL}},
                "pools": {"p": ["plain"]},
            }
        )
        settings = Settings(
            health_interval_s=60,
            first_byte_timeout_s=1.0,
            idle_timeout_s=0.3,
            upstream_transport=request.param,
        )
        with running_server(create_app(settings, config=config)) as url:
            yield Stack(url, fake)


def messages_events(stack: Stack) -> list[ServerSentEvent]:
    with httpx.Client(timeout=10) as client:
        with connect_sse(client, "POST", f"{stack.url}/v1/messages", json=MESSAGES) as source:
            assert source.response.status_code == 200
            return list(source.iter_sse())


def assert_ends_with_anthropic_error(events: list[ServerSentEvent], deltas: int) -> str:
    """The stream's events up to the cut, then Anthropic's error event and nothing else (no
    ``[DONE]``, no OpenAI envelope); returns the error's message."""
    names = [e.event for e in events]
    assert names == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * deltas,
        "error",
    ]
    assert all(e.data != "[DONE]" for e in events)
    body = events[-1].json()
    assert set(body) == {"type", "error"} and body["type"] == "error"
    assert set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == "api_error"
    return str(body["error"]["message"])


def test_messages_stream_cut_part_way_ends_with_anthropics_error_event(stack: Stack) -> None:
    stack.fake.die_after = 3  # the connection drops; /health still answers: no death
    assert assert_ends_with_anthropic_error(messages_events(stack), 3) == BROKE_OFF


def test_messages_stream_idle_past_the_timeout_ends_with_anthropics_error_event(
    stack: Stack,
) -> None:
    stack.fake.delay_s = 0.6  # each delta comes after a gap twice the idle timeout
    assert assert_ends_with_anthropic_error(messages_events(stack), 0) == BROKE_OFF


def test_messages_stream_whose_backend_dies_ends_with_anthropics_error_event(
    stack: Stack,
) -> None:
    stack.fake.die_after, stack.fake.healthy = 3, False  # the stream breaks, /health fails
    message = assert_ends_with_anthropic_error(messages_events(stack), 3)
    assert message.startswith("Backend 'plain' died while serving this request")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
        ("/v1/completions", {"prompt": "x"}),
    ],
)
def test_openai_stream_cut_part_way_ends_as_it_always_did(
    stack: Stack, path: str, body: dict[str, Any]
) -> None:
    """A regression guard (it passes before the fix too): OpenAI's streams keep their bytes."""
    stack.fake.die_after = 3
    sent = body | {"model": MODEL, "stream": True}
    with httpx.stream("POST", f"{stack.url}{path}", json=sent, timeout=10) as resp:
        raw = resp.read()
    assert resp.status_code == 200
    assert raw.endswith(OPENAI_TAIL) and raw.count(b"data: ") == 3 + 2


DIED = BackendDied("plain", "the response broke off", "suspect", 1, 60.0)


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages?beta=true"])
@pytest.mark.parametrize("died", [None, DIED])
def test_messages_renderer_writes_one_anthropic_error_event(
    path: str, died: BackendDied | None
) -> None:
    rendered = stream_failure_event(died, path)
    event, data, end = rendered.split(b"\n", 2)
    assert event == b"event: error" and end == b"\n"
    body = json.loads(data.removeprefix(b"data: "))
    assert body["type"] == "error" and body["error"]["type"] == "api_error"
    assert (body["error"]["message"] == BROKE_OFF) is (died is None)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses"])
def test_openai_renderer_bytes_are_unchanged(path: str) -> None:
    assert stream_failure_event(None, path) == OPENAI_TAIL
    died = stream_failure_event(DIED, path)
    assert died.startswith(b'data: {"error": {"message": "Backend \'plain\' died while serving')
    assert died.endswith(
        b'"type": "server_error", "param": null, "code": "backend_died"}}\n\ndata: [DONE]\n\n'
    )


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (500, "api_error"),  # backend_died
        (502, "api_error"),  # upstream_error: the answer broke off
        (503, "overloaded_error"),  # no_healthy_backend
        (529, "overloaded_error"),
        (504, "timeout_error"),  # upstream_timeout
        (429, "rate_limit_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (422, "invalid_request_error"),  # request_quarantined
        (400, "invalid_request_error"),
    ],
)
def test_anthropic_error_types_follow_anthropics_documented_statuses(
    status: int, kind: str
) -> None:
    assert anthropic_error_type(status) == kind


def test_anthropic_paths() -> None:
    assert anthropic_path("/v1/messages") and anthropic_path("/v1/messages?beta=true")
    assert anthropic_path("/v1/messages/count_tokens?beta=true")
    assert not anthropic_path("/v1/messagesx") and not anthropic_path("/v1/chat/completions")
