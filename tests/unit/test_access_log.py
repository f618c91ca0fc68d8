"""The access log: one ``specgate.access`` line per request, with the routing fields and
timings, never the prompt or a key."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator

import pytest

from gateway.telemetry.access_log import AccessLog, _text_value, access_fields, text_line
from gateway.trace import RequestTrace
from tests.unit.conftest import MODEL, InProcess, local_config

SECRET_PROMPT = "def leak_the_prompt_SECRET_7f3a(): pass"
SECRET_KEY = "sk-live-SECRET-KEY-9b2c"


def access_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "specgate.access"]


async def test_one_text_line_per_request_without_prompt_or_key(
    gw: InProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="specgate.access")
    body = {"model": MODEL, "prompt": SECRET_PROMPT, "max_tokens": 8, "temperature": 0}
    resp = await gw.client.post(
        "/v1/completions",
        json=body,
        headers={
            "x-task-type": "code",
            "x-request-id": "req-42",
            "authorization": f"Bearer {SECRET_KEY}",
        },
    )
    assert resp.status_code == 200
    await gw.client.post("/v1/completions", json=body | {"model": "nope"})
    first, missing = access_lines(caplog)
    backend = resp.headers["x-specgate-backend"]
    assert first.startswith("request_id=req-42 endpoint=completions stream=false task=code ")
    assert f"rule=code-rag-speculative backend={backend} attempts=1 status=200 error=-" in first
    assert " ttft_ms=" in first and " duration_ms=" in first
    assert first.endswith(" completion_tokens=8")
    assert "status=404 error=model_not_found" in missing and "backend=-" in missing
    everything = caplog.text + " ".join(access_lines(caplog))
    assert "SECRET" not in everything and "leak_the_prompt" not in everything


def test_json_lines_and_hostile_request_ids(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="specgate.access")
    trace = RequestTrace('evil"\nid x=1', "chat/completions", stream=True)
    trace.task, trace.rule, trace.backend, trace.attempts = "chat", "default", "plain", 1
    trace.on_chunk(b'data: {"choices": [], "usage": {"completion_tokens": 5}}\n\n')
    trace.finish(200)
    AccessLog("json").observe(trace)
    AccessLog("text").observe(trace)
    as_json, as_text = access_lines(caplog)
    fields = json.loads(as_json)
    assert fields["request_id"] == 'evil"\nid x=1'
    assert (fields["backend"], fields["status"], fields["completion_tokens"]) == ("plain", 200, 5)
    assert fields["duration_ms"] >= 0 and fields["ttft_ms"] is not None
    assert "\n" not in as_text and as_text.startswith('request_id="evil\\"\\nid x=1" ')


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], list[object]]]:
    """``run_gateway`` at a log level with uvicorn left out; returns the apps it would serve.
    The logging switches and every logger it sets are restored after."""
    import uvicorn

    from cli.serve import OWN_LOGGERS, run_gateway
    from gateway.settings import Settings

    served: list[object] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **_: served.append(app))
    for switch in ("_srcfile", "logThreads", "logProcesses", "logMultiprocessing"):
        monkeypatch.setattr(logging, switch, getattr(logging, switch))
    loggers = [logging.getLogger(), *(logging.getLogger(n) for n in OWN_LOGGERS)]
    before = [lg.level for lg in loggers]

    def run(level: str) -> list[object]:
        run_gateway(Settings(log_level=level), local_config())
        return served

    yield run
    for lg, level in zip(loggers, before, strict=True):
        lg.setLevel(level)


def test_log_level_setting_applies_to_the_access_log(serve: Callable[[str], list[object]]) -> None:
    """``SPECGATE_LOG_LEVEL=warning`` drops the per-request lines, not only uvicorn's."""
    assert serve("warning")
    assert not logging.getLogger("specgate.access").isEnabledFor(logging.INFO)


@pytest.mark.parametrize(
    "request_id", ["abc-123", 'evil"\nid x=1', "x" * 300, "", "naïve id", "a=b"]
)
@pytest.mark.parametrize("finished", [True, False])
def test_text_line_is_the_fields_one_by_one(request_id: str, finished: bool) -> None:
    """The hot path's directly formatted line says exactly what the fields say."""
    trace = RequestTrace(request_id, "completions", stream=finished)
    if finished:
        trace.task, trace.rule, trace.backend, trace.attempts = "code", "odd rule", "ngram", 2
        trace.on_chunk(b'data: {"choices": [], "usage": {"completion_tokens": 7}}\n\n')
        trace.finish(200)
    else:
        trace.finish(503, "no_backend")
    expected = " ".join(f"{k}={_text_value(v)}" for k, v in access_fields(trace).items())
    assert text_line(trace) == expected


async def test_debug_decision_line_per_routed_request(
    gw: InProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """At DEBUG, ``specgate.decision`` writes each routed request's decision as
    /routes/explain gives it, under the request's id, and never the prompt or a key."""
    caplog.set_level(logging.DEBUG, logger="specgate.decision")
    body = {"model": MODEL, "prompt": SECRET_PROMPT, "max_tokens": 8, "temperature": 0}
    headers = {"x-task-type": "code", "x-request-id": "req-43"}
    resp = await gw.client.post(
        "/v1/completions", json=body, headers=headers | {"authorization": f"Bearer {SECRET_KEY}"}
    )
    assert resp.status_code == 200
    lines = [r.getMessage() for r in caplog.records if r.name == "specgate.decision"]
    assert len(lines) == 1
    line = json.loads(lines[0])
    assert line["request_id"] == "req-43" and line["concurrency"] >= 1
    assert line["task"] == "code" and line["rule"] == "code-rag-speculative"
    assert line["backend"] == resp.headers["x-specgate-backend"]
    assert line["reasons"] and line["candidates"]
    assert "SECRET" not in lines[0] and "leak_the_prompt" not in lines[0]


async def test_no_decision_line_at_info(gw: InProcess, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="specgate.decision")
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 8, "temperature": 0}
    assert (await gw.client.post("/v1/completions", json=body)).status_code == 200
    assert not [r for r in caplog.records if r.name == "specgate.decision"]


def test_debug_level_is_specgate_own(serve: Callable[[str], list[object]]) -> None:
    """``SPECGATE_LOG_LEVEL=debug`` turns on the decision lines, not the libraries' DEBUG
    output (httpcore logs a dozen lines per health poll)."""
    assert serve("debug")
    assert logging.getLogger("specgate.decision").isEnabledFor(logging.DEBUG)
    assert logging.getLogger("gateway.pipeline").isEnabledFor(logging.DEBUG)
    assert not logging.getLogger("httpcore").isEnabledFor(logging.DEBUG)
    assert logging.getLogger("httpcore").isEnabledFor(logging.INFO)
