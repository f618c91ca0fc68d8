"""One definition of a backend's health, read the same by routing, ``/ready``, ``/routes``,
``/status`` and ``/metrics`` (issue 14, item 4).

The bug: a backend added by a reload (not probed yet) took traffic while ``/ready`` said no
backend was healthy and the metrics gauge said 0.
"""

from __future__ import annotations

from typing import Any

import pytest

from contracts.config import parse_config
from gateway.upstream.state import BackendState, health_of
from tests.unit.conftest import MODEL, InProcess

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


def only_fresh(url: str) -> dict[str, Any]:
    """A config whose only backend, ``fresh``, is new to a running gateway (``url``: a
    fake's, so it can answer)."""
    return {
        "defaults": {"pool": "p"},
        "backends": {"fresh": {"url": url, "model": MODEL}},
        "pools": {"p": ["fresh"]},
    }


@pytest.mark.parametrize(
    ("verdict", "health", "available"),
    [(True, "up", True), (False, "down", False), (None, "unknown", True)],
)
def test_one_definition(verdict: bool | None, health: str, available: bool) -> None:
    state = BackendState(healthy=verdict)
    assert health_of(verdict) == state.health == health
    assert state.available is available
    assert state.snapshot(0.0).healthy is available  # what routing reads


async def test_a_backend_added_by_a_reload_is_unknown_routed_and_ready(gw: InProcess) -> None:
    gateway = gw.app.state.runtime.gateway
    gateway.reload(parse_config(only_fresh(gw.config.backends["plain"].base_url)))
    assert gateway.registry.states["fresh"].healthy is None  # no probe yet

    resp = await gw.client.post("/v1/chat/completions", json=CHAT)
    assert resp.status_code == 200 and resp.headers["x-specgate-backend"] == "fresh"

    ready = await gw.client.get("/ready")
    assert ready.status_code == 200
    assert ready.json() == {
        "status": "ready",
        "healthy_backends": [],
        "unknown_backends": ["fresh"],
    }
    (routed,) = (await gw.client.get("/routes")).json()["backends"]
    assert routed["health"] == "unknown" and routed["healthy"] is None
    metrics = gw.app.state.runtime.metrics.registry
    assert metrics.get_sample_value("specgate_backend_healthy", {"backend": "fresh"}) == 1.0
    for state, value in (("unknown", 1.0), ("up", 0.0), ("down", 0.0)):
        labels = {"backend": "fresh", "state": state}
        assert metrics.get_sample_value("specgate_backend_health", labels) == value
    page = (await gw.client.get("/status")).text
    assert "unknown" in page


async def test_a_down_backend_is_down_everywhere(gw: InProcess) -> None:
    for fake in gw.fakes.values():
        fake.healthy = False
    await gw.poll()
    ready = await gw.client.get("/ready")
    assert ready.status_code == 503
    assert ready.json()["error"]["code"] == "no_healthy_backend"
    assert len(ready.headers["x-request-id"]) == 32  # as every error of the gateway's
    ready = await gw.client.get("/ready", headers={"x-request-id": "probe-7"})
    assert ready.status_code == 503 and ready.headers["x-request-id"] == "probe-7"
    resp = await gw.client.post("/v1/chat/completions", json=CHAT)
    assert resp.status_code == 503
    routed = (await gw.client.get("/routes")).json()["backends"]
    assert {b["health"] for b in routed} == {"down"}
    metrics = gw.app.state.runtime.metrics.registry
    for name in gw.config.backends:
        assert metrics.get_sample_value("specgate_backend_healthy", {"backend": name}) == 0.0
        labels = {"backend": name, "state": "down"}
        assert metrics.get_sample_value("specgate_backend_health", labels) == 1.0
