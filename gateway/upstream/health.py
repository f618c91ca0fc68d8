"""Background polling of every backend: ``GET /health`` and ``GET /metrics``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Literal

import httpx

from contracts.acceptance import is_demoted
from contracts.config import BackendConfig
from contracts.vllm_metrics import parse_vllm_metrics
from gateway.upstream.state import Backends, BackendState

logger = logging.getLogger(__name__)


class HealthPoller:
    """Every ``interval_s`` seconds, probes each backend's ``/health`` and scrapes its
    ``/metrics`` (each with timeout ``timeout_s``), concurrently and off the request path.

    A probe's verdict (:func:`probe_verdict`), in the manner of Kubernetes' probes
    (``failureThreshold``) and Envoy's outlier detection (passive signals from real traffic):

    * ``/health`` answers 200: up, and the failure count is reset;
    * the connection is refused (the process is gone) or ``/health`` answers another status
      (vLLM's server says its engine is dead): down at once (death detection and the
      supervisor rely on this);
    * a timeout or a broken answer is load until proven otherwise: it counts as a failure
      only when the backend sent this gateway nothing (no answer settled, no stream chunk)
      since the previous round (``interval_s + timeout_s``); the backend goes down after
      ``failures`` such probes in a row (and comes back on one passing probe).

    A scrape updates the load figures and, for speculative backends, the acceptance window
    and demotion; a failed scrape keeps the previous figures. ``backends``: see
    :class:`~gateway.upstream.state.Backends` (a reloaded config is followed). ``clock`` is
    ``time.monotonic`` (the clock of :attr:`~gateway.upstream.state.BackendState.alive_at`).
    """

    def __init__(
        self,
        backends: Backends,
        *,
        interval_s: float,
        timeout_s: float,
        failures: int = 3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client, self.config = backends.client, backends.config
        self.registry = backends.registry
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.failures, self.clock = failures, clock

    async def check(self, name: str, backend: BackendConfig) -> None:
        """Probe and scrape one backend and record the results in its state."""
        state = self.registry.states.get(name)
        if state is None:
            return
        health, metrics = await asyncio.gather(
            self._get(f"{backend.base_url}/health"),
            self._get(f"{backend.base_url}/metrics"),
        )
        verdict = probe_verdict(health)
        if verdict == "slow" and self.clock() - state.alive_at <= self.interval_s + self.timeout_s:
            verdict = "up"  # busy answering this gateway's requests: alive
        if verdict == "up":
            state.probe_failures = 0
        else:
            state.probe_failures += 1
        # a slow probe keeps an up backend up until the threshold; it never brings one up
        healthy = verdict == "up" or (
            verdict == "slow" and state.healthy is True and state.probe_failures < self.failures
        )
        if healthy != state.healthy:
            logger.info(
                "backend %s is now %s (%s)",
                name,
                "healthy" if healthy else "unhealthy",
                "probe passed" if verdict == "up" else _describe(health),
            )
        state.mark(healthy, release=verdict == "down")  # not for slow probes alone
        state.last_error = None if verdict == "up" else _describe(health)
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
        state.scraped(metrics.running, metrics.waiting, now)
        state.kv_cache_usage = metrics.kv_cache_usage
        state.last_scrape = time.time()
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


def probe_verdict(result: httpx.Response | Exception) -> Literal["up", "down", "slow"]:
    """One ``/health`` probe's outcome: ``up`` (200), ``down`` (refused connection or
    another status: the server or its engine is gone), ``slow`` (a timeout, a reset or a
    broken answer: may be load)."""
    if isinstance(result, httpx.Response):
        return "up" if result.status_code == 200 else "down"
    if isinstance(result, httpx.ConnectError):
        return "down"
    return "slow"


def _describe(result: httpx.Response | Exception) -> str:
    if isinstance(result, httpx.Response):
        return f"/health answered {result.status_code}"
    return type(result).__name__
