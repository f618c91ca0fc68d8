"""The probe port (``SPECGATE_HEALTH_PORT``, issue 26): ``/health`` and ``/ready`` answered
from a thread, so a probe never waits for a busy event loop, and 503 when the loop is stuck."""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time
from typing import Any

from gateway.errors import no_backend
from gateway.probe_port import Answer, ProbeServer, Snapshot, heartbeat
from tests.unit.conftest import gateway_settings, in_process


def get(port: int, path: str) -> tuple[int, dict[str, Any], float]:
    """``GET path`` on 127.0.0.1:``port`` on a new connection: status, JSON body, seconds."""
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        body = json.loads(response.read())
    finally:
        conn.close()
    return response.status, body, time.perf_counter() - started


def hog_the_loop(seconds: float) -> None:
    """Block the calling thread (here: the event loop, on purpose, as a CPU-bound handler
    would)."""
    time.sleep(seconds)


async def test_off_by_default() -> None:
    settings = gateway_settings()
    assert settings.health_port is None
    async with in_process(settings) as gw:
        assert gw.app.state.runtime.probe_server is None


async def test_health_answers_while_the_loop_is_blocked() -> None:
    async with in_process(gateway_settings(health_port=0)) as gw:
        port = gw.app.state.runtime.probe_server.port
        seen: list[tuple[int, dict[str, Any], float]] = []
        prober = threading.Thread(target=lambda: seen.append(get(port, "/health")))
        prober.start()
        hog_the_loop(0.5)
        prober.join()
        assert seen[0][:2] == (200, {"status": "ok"})
        assert seen[0][2] < 0.25  # answered during the 0.5 s the loop was blocked


async def test_health_is_503_when_the_heartbeat_is_stale() -> None:
    async with in_process(gateway_settings(health_port=0, health_port_stale_s=0.2)) as gw:
        port = gw.app.state.runtime.probe_server.port
        assert (await asyncio.to_thread(get, port, "/health"))[0] == 200
        seen: list[tuple[int, dict[str, Any], float]] = []
        late = threading.Thread(target=lambda: (time.sleep(0.5), seen.append(get(port, "/health"))))
        late.start()
        hog_the_loop(0.8)  # the loop is stuck for longer than the bound
        prober = late
        prober.join()
        status, body, _ = seen[0]
        assert status == 503
        assert body["error"]["code"] == "event_loop_stalled"
        await asyncio.sleep(0.3)  # the loop runs again: the next heartbeat clears it
        assert (await asyncio.to_thread(get, port, "/health"))[0] == 200


async def test_ready_mirrors_the_main_port() -> None:
    async with in_process(gateway_settings(health_port=0)) as gw:
        port = gw.app.state.runtime.probe_server.port
        main = await gw.client.get("/ready")
        status, body, _ = await asyncio.to_thread(get, port, "/ready")
        assert (status, body) == (main.status_code, main.json()) == (200, main.json())
        for fake in gw.fakes.values():
            fake.healthy = False
        await gw.poll()
        await asyncio.sleep(0.25)  # two heartbeats
        main = await gw.client.get("/ready")
        status, body, _ = await asyncio.to_thread(get, port, "/ready")
        assert (status, body) == (main.status_code, main.json())
        assert status == 503 and body["error"]["code"] == "no_healthy_backend"


def test_unknown_path_is_404_in_the_openai_envelope_and_clock_is_injectable() -> None:
    now = [100.0]
    ready = Answer(200, {"status": "ready", "healthy_backends": [], "unknown_backends": []})
    server = ProbeServer(("127.0.0.1", 0), Snapshot(100.0, ready), stale_after_s=5.0,
                         clock=lambda: now[0])  # fmt: skip
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        status, body, _ = get(server.port, "/v1/models")
        assert status == 404 and body["error"]["type"] == "invalid_request_error"
        assert get(server.port, "/health")[0] == 200
        now[0] = 105.5  # 5.5 s without a heartbeat
        status, body, _ = get(server.port, "/health")
        assert status == 503 and "5.5 s" in body["error"]["message"]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_an_error_carries_the_request_id_as_on_the_main_port() -> None:
    """404, a stale heartbeat's 503 and ``/ready``'s 503: the client's ``x-request-id``
    echoed, else a new one; a 200 carries none (as the main port's ``/health``)."""
    down = no_backend("No backend is healthy.")
    now = [100.0]
    server = ProbeServer(("127.0.0.1", 0), Snapshot(100.0, Answer(503, down.envelope())),
                         stale_after_s=5.0, clock=lambda: now[0])  # fmt: skip
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()

    def request_id(path: str, given: str | None = None) -> tuple[int, str | None]:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        try:
            conn.request("GET", path, headers={"x-request-id": given} if given else {})
            response = conn.getresponse()
            response.read()
            return response.status, response.getheader("x-request-id")
        finally:
            conn.close()

    try:
        assert request_id("/ready", "probe-7") == (503, "probe-7")
        status, new = request_id("/v1/models")
        assert status == 404 and new is not None and len(new) == 32
        assert request_id("/health") == (200, None)
        now[0] = 106.0  # stale
        assert request_id("/health", "k8s-1") == (503, "k8s-1")
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def test_the_port_is_closed_after_shutdown() -> None:
    async with in_process(gateway_settings(health_port=0)) as gw:
        port = gw.app.state.runtime.probe_server.port
    try:
        await asyncio.to_thread(get, port, "/health")
    except OSError:
        return
    raise AssertionError("the probe port still answers after the lifespan ended")


async def test_a_failing_readiness_keeps_the_heartbeat_and_the_last_answer() -> None:
    ready = Answer(200, {"status": "ready", "healthy_backends": ["b"], "unknown_backends": []})
    calls = [ready]

    def readiness() -> Answer:
        if calls:
            return calls.pop()
        raise RuntimeError("backend views broke")

    server = ProbeServer(("127.0.0.1", 0), Snapshot(0.0, ready), stale_after_s=5.0)
    try:
        beat = asyncio.create_task(heartbeat(server, readiness))
        await asyncio.sleep(0.35)  # one good snapshot, then failing ones
        assert server.snapshot.ready == ready
        assert server.answer("GET", "/health").status == 200  # the loop still beats
        beat.cancel()
    finally:
        server.server_close()
