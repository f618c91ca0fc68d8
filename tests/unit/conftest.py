"""In-process gateway fixtures: the shipped local config, fake vLLM backends per port."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from contracts.config import GatewayConfig, load_config
from gateway.app import create_app
from gateway.settings import Settings
from tests.fakes.fake_vllm import FakeBehaviour, create_fake_vllm
from tests.fakes.transport import BackendsTransport

ROOT = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-instruct"


@dataclass
class InProcess:
    """A gateway app with its fake backends, and a client talking to it; ``backends`` routes
    the gateway's upstream requests to the fakes (empty its ``transports`` to refuse them)."""

    client: httpx.AsyncClient
    fakes: dict[str, FakeBehaviour]
    config: GatewayConfig
    app: FastAPI
    backends: BackendsTransport

    async def poll(self) -> None:
        """Run one health and metrics poll now."""
        await self.app.state.runtime.poller.check_all()


def local_config() -> GatewayConfig:
    return load_config(ROOT / "config" / "local.yaml")


def static_config() -> GatewayConfig:
    """The shipped local config under ``policy: static`` (for tests of the rules' own
    mechanics: demotion, probes, canary exclusions)."""
    config = local_config()
    routing = config.routing.model_copy(update={"policy": "static"})
    return config.model_copy(update={"routing": routing})


def gateway_settings(**overrides: Any) -> Settings:
    """The in-process gateway's settings: a small body limit, no background health polls,
    adaptive state in memory only (a script that borrows these outside pytest, without the
    fixtures below, must not overwrite the user's real state file)."""
    base: dict[str, Any] = {"max_body_bytes": 64 * 1024, "health_interval_s": 60,
                            "state_persist": False}  # fmt: skip
    return Settings(**(base | overrides))


@asynccontextmanager
async def in_process(
    settings: Settings,
    config: GatewayConfig | None = None,
    *,
    refused: bool = False,
    fakes: dict[str, FakeBehaviour] | None = None,
) -> AsyncIterator[InProcess]:
    """``config`` (default: the shipped local config) behind ``settings``, a fake vLLM
    server per backend (``fakes``' behaviour where it names the backend: what the gateway
    reads at startup, such as the model cards); ``refused``: every backend refuses
    connections until the caller fills ``backends.transports`` (``BackendsTransport.
    refusing``): a gateway started before its backends."""
    config = config or local_config()
    fakes = {name: (fakes or {}).get(name) or FakeBehaviour(name=name) for name in config.backends}
    apps = {
        b.base_url.removeprefix("http://"): create_fake_vllm(fakes[name])
        for name, b in config.backends.items()
    }
    backends = BackendsTransport(apps)
    if refused:
        backends.refusing, backends.transports = backends.transports, {}
    app = create_app(settings, config=config, transport=backends, rng=random.Random(1))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            yield InProcess(client, fakes, config, app, backends)


@pytest.fixture
async def gw() -> AsyncIterator[InProcess]:
    async with in_process(gateway_settings()) as gateway:
        yield gateway


@pytest.fixture(scope="session", autouse=True)
def _no_real_state_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The same for gateways built by module-scoped fixtures (test_fuzz's), which are set up
    before any function-scoped fixture runs: without it they saved to the real cache."""
    path = tmp_path_factory.mktemp("state") / "adaptive-routing.json"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECGATE_STATE_FILE", str(path))
        yield


@pytest.fixture(autouse=True)
def _no_shared_state_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Gateways built by tests keep their adaptive state under the test's tmp_path, never
    in the real cache directory."""
    monkeypatch.setenv("SPECGATE_STATE_FILE", str(tmp_path / "state" / "adaptive-routing.json"))


async def eventually(check: Any, within_s: float, step_s: float = 0.1) -> float:
    """Seconds until the async ``check()`` is true; fails past ``within_s``."""
    start = time.monotonic()
    while not await check():
        assert time.monotonic() - start < within_s, f"not true within {within_s} s"
        await asyncio.sleep(step_s)
    return time.monotonic() - start
