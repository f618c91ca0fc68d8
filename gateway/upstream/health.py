"""Background polling of every backend: ``GET /health`` and ``GET /metrics``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import httpx

from contracts.acceptance import is_demoted
from contracts.config import BackendConfig, GatewayConfig
from contracts.vllm_metrics import parse_vllm_metrics
from gateway.upstream.state import BackendRegistry, BackendState

logger = logging.getLogger(__name__)


class HealthPoller:
    """Every ``interval_s`` seconds, probes each backend's ``/health`` and scrapes its
    ``/metrics`` (each with timeout ``timeout_s``), concurrently and off the request path.

    A backend is healthy when ``/health`` answers 200. A scrape updates the load figures and,
    for speculative backends, the acceptance window and demotion; a failed scrape keeps the
    previous figures. ``config`` is a callable so a reloaded config is followed.
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        config: Callable[[], GatewayConfig],
        registry: BackendRegistry,
        *,
        interval_s: float,
        timeout_s: float,
    ) -> None:
        self.client = client
        self.config = config
        self.registry = registry
        self.interval_s = interval_s
        self.timeout_s = timeout_s

    async def check(self, name: str, backend: BackendConfig) -> None:
        """Probe and scrape one backend and record the results in its state."""
        state = self.registry.states.get(name)
        if state is None:
            return
        health, metrics = await asyncio.gather(
            self._get(f"{backend.base_url}/health"),
            self._get(f"{backend.base_url}/metrics"),
        )
        healthy = isinstance(health, httpx.Response) and health.status_code == 200
        if healthy != state.healthy:
            logger.info("backend %s is now %s", name, "healthy" if healthy else "unhealthy")
        state.healthy = healthy
        state.last_error = None if healthy else _describe(health)
        state.last_checked = time.time()
        if isinstance(metrics, httpx.Response) and metrics.status_code == 200:
            self._record(name, backend, state, metrics.text)

    async def _get(self, url: str) -> httpx.Response | Exception:
        try:
            return await self.client.get(url, timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            return exc

    def _record(self, name: str, backend: BackendConfig, state: BackendState, text: str) -> None:
        try:
            metrics = parse_vllm_metrics(text)
        except ValueError:
            logger.warning("backend %s: unreadable /metrics", name)
            return
        now = time.monotonic()
        state.running, state.waiting = metrics.running, metrics.waiting
        state.kv_cache_usage = metrics.kv_cache_usage
        state.last_scrape = time.time()
        state.scraped_at = now
        if metrics.spec is None:
            return
        routing = self.config().routing
        state.window.window_s = routing.acceptance_window_s
        state.window.add(now, metrics.spec)
        state.acceptance = state.window.stats()
        floor = backend.acceptance_floor(routing.min_acceptance_rate)
        demoted = is_demoted(state.acceptance, floor, routing.min_draft_tokens)
        if demoted and not state.demoted:
            state.demotions += 1
            logger.info(
                "backend %s demoted: acceptance rate %.3f < %s",
                name,
                state.acceptance.rate if state.acceptance else 0.0,
                floor,
            )
        state.demoted = demoted

    async def check_all(self) -> None:
        """Probe every configured backend once, concurrently."""
        backends = self.config().backends
        await asyncio.gather(*(self.check(n, b) for n, b in backends.items()))

    async def run(self) -> None:
        """Poll forever, every ``interval_s`` seconds; cancelled at shutdown."""
        while True:
            await asyncio.sleep(self.interval_s)
            await self.check_all()


def _describe(result: httpx.Response | Exception) -> str:
    if isinstance(result, httpx.Response):
        return f"/health answered {result.status_code}"
    return type(result).__name__
