"""Trailing slashes answered as vLLM answers them (issue 26, item 6): a 307 to the path
without the slash when that path is served, on routed, own, admin and relayed paths.

The bug: ``POST /v1/chat/completions/`` got 404 through the gateway where vLLM (FastAPI,
``redirect_slashes``) answers 307 to ``/v1/chat/completions`` and the OpenAI SDK follows.
"""

from __future__ import annotations

import pytest

from tests.unit.conftest import MODEL, InProcess

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


@pytest.mark.parametrize(
    ("method", "path", "canonical"),
    [
        ("POST", "/v1/chat/completions/", "/v1/chat/completions"),
        ("POST", "/v1/completions/?x=1", "/v1/completions?x=1"),
        ("POST", "/v1/responses/", "/v1/responses"),
        ("POST", "/v1/messages//", "/v1/messages"),
        ("GET", "/v1/chat/completions/", "/v1/chat/completions"),  # then 405, as vLLM
        ("GET", "/health/", "/health"),
        ("GET", "/ready/", "/ready"),
        ("GET", "/metrics/", "/metrics"),
        ("GET", "/v1/models/", "/v1/models"),
        ("GET", "/routes/", "/routes"),
        ("POST", "/routes/explain/", "/routes/explain"),
        ("POST", "/tokenize/", "/tokenize"),  # relayed: listed in the backends' openapi
        ("GET", "/version/", "/version"),
        (
            "POST",
            "/routes/backends/plain/reset_prefix_cache/",
            "/routes/backends/plain/reset_prefix_cache",
        ),  # fmt: skip
    ],
)
async def test_a_trailing_slash_redirects_to_the_served_path(
    gw: InProcess, method: str, path: str, canonical: str
) -> None:
    resp = await gw.client.request(method, path, json=CHAT)
    assert resp.status_code == 307
    assert resp.headers["location"] == f"http://gw{canonical}"


@pytest.mark.parametrize("path", ["/nothing/", "/v1/nothing/", "/routes/backends/nobody/x"])
async def test_paths_served_nowhere_stay_404(gw: InProcess, path: str) -> None:
    resp = await gw.client.post(path, json=CHAT)
    assert resp.status_code == 404
    assert resp.json()["error"]["message"]


async def test_a_client_following_the_redirect_gets_the_answer(gw: InProcess) -> None:
    resp = await gw.client.post("/v1/chat/completions/", json=CHAT, follow_redirects=True)
    assert resp.status_code == 200
    assert resp.headers["x-specgate-backend"] == "plain"
    assert [r.status_code for r in resp.history] == [307]


async def test_paths_without_a_trailing_slash_are_untouched(gw: InProcess) -> None:
    assert (await gw.client.get("/health")).status_code == 200
    assert (await gw.client.get("/")).status_code == 404
