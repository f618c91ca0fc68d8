"""bench.speedup --quiet-gateways: a gateway's wave waits until the gateway counts no other
clients' request (the bench's single backends and other gateways just loaded the servers;
docs/benchmarks.md section 7b, session 36)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from bench import speedup
from bench.workloads import Item
from contracts.config import load_config
from tests.fakes.servers import free_port, running_server

CONFIG = Path(__file__).resolve().parents[2] / "config" / "local.yaml"


class _Routes:
    """An app whose ``/routes`` answers, in turn, one backend list per value of ``others``
    (its ``load.other_clients``; the last repeats), or, for a value of None, a 500;
    ``status`` for every answer when not 200 (404: not specgate). ``calls``: reads so far."""

    def __init__(self, others: list[float | None], status: int = 200) -> None:
        self.calls = 0
        self.app = FastAPI()

        @self.app.get("/routes")
        def routes() -> Any:
            value = others[min(self.calls, len(others) - 1)]
            self.calls += 1
            if value is None or status != 200:
                return JSONResponse({}, status_code=500 if value is None else status)
            return {"backends": [{"name": "plain", "load": {"other_clients": 0.0}},
                                 {"name": "eagle3", "load": {"other_clients": value}}]}  # fmt: skip


def test_a_gateway_is_waited_for_until_it_counts_no_other_client() -> None:
    """3, then 0.6 (rounds to 1), then 0.4 (rounds to 0: quiet): three reads, two polls."""
    gateway = _Routes([3.0, 0.6, 0.4])
    with running_server(gateway.app) as url:
        waited = speedup.wait_quiet(url + "/", timeout_s=5.0, poll_s=0.05)
    assert gateway.calls == 3
    assert 0.1 <= waited < 3.0


def test_a_failed_read_during_the_wait_is_read_again() -> None:
    """A 500 after the gateway answered once is not taken for "not specgate"."""
    gateway = _Routes([2.0, None, 0.0])
    with running_server(gateway.app) as url:
        speedup.wait_quiet(url, timeout_s=5.0, poll_s=0.05)
    assert gateway.calls == 3


def test_the_wait_ends_at_its_bound_and_a_relay_is_not_waited_for() -> None:
    busy, relay = _Routes([2.0]), _Routes([2.0], status=404)
    with running_server(busy.app) as busy_url, running_server(relay.app) as relay_url:
        assert 0.3 <= speedup.wait_quiet(busy_url, timeout_s=0.3, poll_s=0.05) < 3.0
        assert speedup.wait_quiet(relay_url, timeout_s=5.0) < 3.0 and relay.calls == 1
    nothing = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    assert speedup.wait_quiet(nothing, timeout_s=5.0) < 3.0


def test_measure_waits_before_each_gateway_wave_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Single backends and relays are sent to at once; each gateway's wave waits, and its
    run reports the seconds waited (``quiet_wait_s``)."""
    config = load_config(CONFIG)
    waited: list[str] = []

    def wait_quiet(url: str, timeout_s: float) -> float:
        assert timeout_s == 3.0
        waited.append(url)
        return 0.25

    monkeypatch.setattr(speedup, "wait_quiet", wait_quiet)
    monkeypatch.setattr(speedup, "run_items", lambda *_a, **_k: ([], 0.0))
    monkeypatch.setattr(speedup, "scrape", lambda _config: {})
    monkeypatch.setattr(speedup.time, "sleep", lambda _s: None)
    items = [Item("chat", str(i), "/v1/chat/completions", {"messages": []}, 10) for i in range(8)]
    extra = [("adaptive", "http://adaptive"), ("relay-bare", "http://relay")]
    runs = speedup.measure(
        config, "http://gateway", items, [4], 64, list(config.backends), extra, 0.0, quiet_s=3.0
    )
    assert sorted(waited) == sorted(["http://gateway", "http://adaptive"] * 2)  # two waves
    by_target = {r["target"]: r["quiet_wait_s"] for r in runs}
    assert by_target["specgate"] == by_target["adaptive"] == 0.5
    assert by_target["relay-bare"] == by_target["plain"] == 0.0
