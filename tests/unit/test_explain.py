"""POST /routes/explain and `specgate explain`: the decision without calling a backend."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from cli.main import main
from gateway.upstream.quarantine import fingerprint
from tests.unit.conftest import MODEL, InProcess

ROOT = Path(__file__).resolve().parents[2]
CODE_CHAT = {
    "model": MODEL,
    "temperature": 0.2,
    "messages": [{"role": "user", "content": "Write a Python function that reverses a list."}],
}


async def test_explain_over_http(gw: InProcess) -> None:
    resp = await gw.client.post("/routes/explain", json=CODE_CHAT)
    assert resp.status_code == 200
    out = resp.json()
    assert out["task"] == "code"
    assert 0 < out["task_confidence"] <= 1
    assert out["task_source"] == "classifier"
    # what decided it: the features that fired and the four probabilities
    assert out["task_features"]["code_langs"] > 0
    assert out["task_features"]["p_code"] == pytest.approx(out["task_confidence"])
    assert out["temperature"] == 0.2
    assert out["rule"] == "code-rag-speculative"
    assert out["backend"] in {"eagle3", "ngram", "draft"}
    kept = {c["backend"] for c in out["candidates"] if c["kept"]}
    assert kept == {"eagle3", "ngram", "draft", "plain"}
    assert out["reasons"][0].startswith("rule 'code-rag-speculative' matched")
    assert not any(f.received for f in gw.fakes.values())  # no backend was called
    routes = (await gw.client.get("/routes")).json()
    assert routes["decisions"]["by_rule"] == {}  # explain is not counted


async def test_explain_with_headers_and_live_state(gw: InProcess) -> None:
    wrapped = {"body": CODE_CHAT | {"temperature": 1.0}, "headers": {"X-Task-Type": "creative"}}
    out = (await gw.client.post("/routes/explain", json=wrapped)).json()
    assert (out["task"], out["task_source"], out["rule"], out["backend"]) == (
        "creative",
        "header",
        "creative-plain",
        "plain",
    )


async def test_explain_errors_use_the_envelope(gw: InProcess) -> None:
    resp = await gw.client.post("/routes/explain", json={"model": "nope", "prompt": "x"})
    assert resp.status_code == 404
    assert resp.json()["error"]["code"] == "model_not_found"
    resp = await gw.client.post("/routes/explain", content=b"{")
    assert resp.status_code == 400
    for body in ("nope", [1], None):  # the wrapper's body is a request body or nothing
        resp = await gw.client.post("/routes/explain", json={"body": body})
        assert resp.status_code == 400
        assert resp.json()["error"]["param"] == "body"
    body = {"model": MODEL, "prompt": "x"}
    for field, value in (("headers", "x-task-type: code"), ("headers", [1]), ("endpoint", 5)):
        resp = await gw.client.post("/routes/explain", json={"body": body, field: value})
        assert resp.status_code == 400
        assert resp.json()["error"]["param"] == field
    for field in ("headers", "endpoint"):  # null: as if absent
        resp = await gw.client.post("/routes/explain", json={"body": body, field: None})
        assert resp.status_code == 200


def test_explain_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(CODE_CHAT)))
    assert main(["explain", "--config", str(ROOT / "config" / "local.yaml")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rule"] == "code-rag-speculative" and out["task"] == "code"
    monkeypatch.setattr("sys.stdin", io.StringIO('{"model": "x", "prompt": "y"}'))
    assert main(["explain", "--config", str(ROOT / "config" / "local.yaml")]) == 1
    assert json.loads(capsys.readouterr().out)["error"]["code"] == "model_not_found"


async def test_explain_follows_the_conversation_as_the_route_does(gw: InProcess) -> None:
    first = {"model": MODEL, "input": "Write a short poem about the sea.", "temperature": 0}
    created = await gw.client.post("/v1/responses", json=first, headers={"x-task-type": "code"})
    holder, rid = created.headers["x-specgate-backend"], created.json()["id"]
    follow = {"model": MODEL, "input": "And again?", "previous_response_id": rid}
    out = (await gw.client.post("/routes/explain", json=follow)).json()
    assert (out["backend"], out["backends"]) == (holder, [holder])
    assert out["reasons"][-1] == f"{holder}: holds previous_response_id"
    routed = await gw.client.post("/v1/responses", json=follow)
    assert routed.headers["x-specgate-backend"] == holder


async def test_explain_refuses_a_quarantined_body_as_the_route_does(gw: InProcess) -> None:
    table = gw.app.state.runtime.deaths.table
    table.record(
        [(fingerprint("/v1/chat/completions", CODE_CHAT), "/v1/chat/completions")], "plain", "500"
    )
    for path in ("/routes/explain", "/v1/chat/completions"):
        resp = await gw.client.post(path, json=CODE_CHAT)
        assert resp.status_code == 422 and resp.json()["error"]["code"] == "request_quarantined"
    other = await gw.client.post("/routes/explain", json=CODE_CHAT | {"temperature": 0.3})
    assert other.status_code == 200
