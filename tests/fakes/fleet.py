"""A fleet of gateway replicas sharing state through a real ``redis-server``, in front of
in-process fake backends (tests/unit/test_replicas.py and ``python -m bench.replicas``).

:class:`RedisProcess` runs Debian's ``redis-server`` on an ephemeral 127.0.0.1 port without
persistence (``--save '' --appendonly no``), so a restart comes back empty, as a cache pod
does; :func:`running_fleet` serves ``n`` replicas of one config on real uvicorn servers on
ephemeral ports (each its own event loop in a thread), sharing the same fake backends.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from contracts.config import GatewayConfig
from gateway.app import create_app
from gateway.settings import Settings
from tests.fakes.fake_vllm import FakeBehaviour, create_fake_vllm
from tests.fakes.servers import free_port, running_server
from tests.fakes.transport import BackendsTransport

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


class RedisProcess:
    """A ``redis-server`` on ``127.0.0.1:port`` that can be stopped and started again."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it and wait until it answers PING (10 s at most)."""
        if not Path(REDIS_SERVER).exists():
            raise RuntimeError("redis-server is not installed: run scripts/ci-deps.sh as root")
        argv = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1"]
        argv += ["--save", "", "--appendonly", "no", "--loglevel", "warning"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=0.5)
        deadline = time.monotonic() + 10
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(
                            f"redis-server on port {self.port} did not start"
                        ) from None
                    time.sleep(0.05)
        finally:
            client.close()

    def kill(self) -> None:
        """Kill it (SIGKILL: no goodbye to its clients) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def client(self) -> redis.Redis:
        """A synchronous client, for tests that look at the keys."""
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)


@contextlib.contextmanager
def running_redis() -> Iterator[RedisProcess]:
    """A fresh ``redis-server`` for the block, killed at its end."""
    server = RedisProcess()
    server.start()
    try:
        yield server
    finally:
        server.kill()


@dataclass
class Fleet:
    """The replicas' base URLs (index = replica number) and the fakes they share."""

    urls: list[str]
    fakes: dict[str, FakeBehaviour]
    apps: list[Any]


def redis_config(config: GatewayConfig, url: str, **state: Any) -> GatewayConfig:
    """``config`` with ``state: {backend: redis, url: url, **state}``."""
    data = config.model_dump(exclude_unset=True)
    data["state"] = {"backend": "redis", "url": url, **state}
    return GatewayConfig.model_validate(data)


@contextlib.contextmanager
def running_fleet(
    config: GatewayConfig, n: int = 3, settings: dict[str, Any] | None = None
) -> Iterator[Fleet]:
    """``n`` replicas (``SPECGATE_REPLICA_ID`` ``r0``..) of ``config`` on real sockets, one
    fake backend per configured backend shared by all of them."""
    fakes = {name: FakeBehaviour(name=name) for name in config.backends}
    apps = {
        b.base_url.removeprefix("http://"): create_fake_vllm(fakes[name])
        for name, b in config.backends.items()
    }
    base = {"health_interval_s": 60, "state_persist": False} | (settings or {})
    gateways = [
        create_app(
            Settings(**base, replica_id=f"r{i}"),
            config=config,
            transport=BackendsTransport(apps),
            rng=random.Random(i),
        )
        for i in range(n)
    ]
    with contextlib.ExitStack() as stack:
        # keep-alive past the longest test, so no pooled connection races its server's close
        urls = [
            stack.enter_context(running_server(app, timeout_keep_alive=120)) for app in gateways
        ]
        yield Fleet(urls, fakes, gateways)
