"""Request traces: observers see every request once, with timings and usage tokens."""

from __future__ import annotations

from gateway.trace import RequestTrace
from tests.unit.conftest import MODEL, InProcess

CODE = {"model": MODEL, "prompt": "def f(x):", "max_tokens": 8, "temperature": 0}


async def test_observers_see_each_request_once(gw: InProcess) -> None:
    seen: list[RequestTrace] = []
    gw.app.state.runtime.gateway.observers.append(seen.append)
    await gw.client.post("/v1/completions", json=CODE, headers={"x-task-type": "code"})
    await gw.client.post(
        "/v1/completions",
        json=CODE | {"stream": True},
        headers={"x-task-type": "chat", "x-request-id": "r2"},
    )
    await gw.client.post("/v1/completions", json=CODE | {"model": "nope"})
    assert [(t.status, t.stream, t.error) for t in seen] == [
        (200, False, None),
        (200, True, None),
        (404, False, "model_not_found"),
    ]
    first, streamed, missing = seen
    assert first.backend in {"eagle3", "ngram", "draft"} and first.rule == "code-rag-speculative"
    assert first.completion_tokens() == 8  # from the JSON body's usage
    assert streamed.request_id == "r2" and streamed.backend == "plain"
    assert streamed.chunks >= 1 and streamed.ttft_s is not None
    assert streamed.completion_tokens() is None  # the fake stream carries no usage
    assert missing.backend is None and missing.duration_s is not None


def test_usage_from_the_final_stream_chunk() -> None:
    trace = RequestTrace("r", "completions", stream=True)
    trace.on_chunk(b'data: {"choices": [{"text": "a"}]}\n\n')
    trace.on_chunk(
        b'data: {"choices": [], "usage": {"prompt_tokens": 3, '
        b'"completion_tokens": 17, "total_tokens": 20}}\n\ndata: [DONE]\n\n'
    )
    trace.finish(200)
    assert trace.completion_tokens() == 17
    assert len(trace.gaps_s) == 1 and trace.chunks == 2
