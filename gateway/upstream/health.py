"""Background health probing of every backend's ``GET /health``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import httpx

from gateway.config import GatewayConfig
from gateway.upstream.state import BackendRegistry

logger = logging.getLogger(__name__)


class HealthPoller:
    """Probes each backend's ``/health`` every ``interval_s`` seconds (timeout ``timeout_s``).

    A backend is healthy when ``/health`` answers 200. Probes run concurrently and never
    block requests; a failed probe only flips the state the routing policy reads.
    ``config`` is a callable so a reloaded config is followed without restarting the poller.
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

    async def check(self, name: str, base_url: str) -> None:
        """Probe one backend and record the verdict in its state."""
        state = self.registry.states.get(name)
        if state is None:
            return
        try:
            resp = await self.client.get(f"{base_url}/health", timeout=self.timeout_s)
            healthy, error = resp.status_code == 200, f"/health answered {resp.status_code}"
        except httpx.HTTPError as exc:
            healthy, error = False, type(exc).__name__
        if healthy != state.healthy:
            logger.info("backend %s is now %s", name, "healthy" if healthy else "unhealthy")
        state.healthy = healthy
        state.last_error = None if healthy else error
        state.last_checked = time.time()

    async def check_all(self) -> None:
        """Probe every configured backend once, concurrently."""
        backends = self.config().backends
        await asyncio.gather(*(self.check(n, b.base_url) for n, b in backends.items()))

    async def run(self) -> None:
        """Probe forever, every ``interval_s`` seconds; cancelled at shutdown."""
        while True:
            await self.check_all()
            await asyncio.sleep(self.interval_s)
