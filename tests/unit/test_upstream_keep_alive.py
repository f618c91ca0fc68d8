"""How long the forwarder keeps an idle connection to a backend (``backend_keep_alive_s``).

A pooled connection saves a burst its connects; it must be dropped before the backend's own
idle timeout closes it under a request (vLLM: ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``, 5 s). A real
aiohttp server counts the client ports it was reached from: one connection reused, or a
new one after the idle gap.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from gateway.runtime import build_client
from gateway.settings import Settings
from gateway.upstream.client import AiohttpUpstream


@pytest.fixture
async def backend() -> AsyncIterator[tuple[str, set[int]]]:
    """(URL, client ports seen): a backend answering ``POST /v1/completions`` with ``{}``."""
    ports: set[int] = set()

    async def completions(request: web.Request) -> web.Response:
        assert request.transport is not None
        ports.add(request.transport.get_extra_info("peername")[1])
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app, keepalive_timeout=60)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}/v1/completions", ports
    await runner.cleanup()


async def connections_for_two_requests(url: str, ports: set[int], keep_alive_s: float) -> int:
    """Two requests 0.5 s apart through an upstream keeping idle connections
    ``keep_alive_s``; how many connections the backend saw."""
    upstream = AiohttpUpstream(max_connections=8, connect_timeout_s=2.0, keep_alive_s=keep_alive_s)
    try:
        for gap in (0.0, 0.5):
            await asyncio.sleep(gap)
            response = await upstream.post(
                url,
                b"{}",
                {"content-type": "application/json"},
                first_byte_timeout_s=5.0,
                idle_timeout_s=5.0,
            )
            assert [chunk async for chunk in response.chunks()] == [b"{}"]
            await response.aclose()
    finally:
        await upstream.aclose()
    return len(ports)


async def test_default_is_below_vllms_idle_timeout() -> None:
    assert Settings().backend_keep_alive_s == 4.0  # vLLM closes idle connections at 5 s


async def test_an_idle_connection_is_reused_within_the_keep_alive(
    backend: tuple[str, set[int]],
) -> None:
    assert await connections_for_two_requests(*backend, keep_alive_s=5.0) == 1


async def test_an_idle_connection_is_dropped_after_the_keep_alive(
    backend: tuple[str, set[int]],
) -> None:
    assert await connections_for_two_requests(*backend, keep_alive_s=0.2) == 2


@pytest.mark.parametrize(("keep_alive_s", "connections"), [(5.0, 1), (0.2, 2)])
async def test_the_httpx_client_keeps_connections_as_long(
    backend: tuple[str, set[int]], keep_alive_s: float, connections: int
) -> None:
    """The health poller's and canaries' client (and the forwarder's with
    ``SPECGATE_UPSTREAM_TRANSPORT=httpx``) reads the same setting."""
    url, ports = backend
    client = build_client(Settings(backend_keep_alive_s=keep_alive_s), None)
    async with client:
        for gap in (0.0, 0.5):
            await asyncio.sleep(gap)
            response = await client.post(url, content=b"{}")
            assert response.status_code == 200 and response.content == b"{}"
    assert len(ports) == connections
