"""The ``state`` block: validated like the rest of the config; a replica whose Redis is not
there starts, serves and says so; what the logs and /routes show of a URL hides its password."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from contracts.config import ConfigError, parse_config
from gateway.state.sync import redacted
from tests.fakes.fleet import redis_config
from tests.fakes.servers import free_port
from tests.unit.conftest import MODEL, gateway_settings, in_process, local_config

BASE = local_config().model_dump(mode="json", exclude_unset=True)


@pytest.mark.parametrize(
    ("state", "problem"),
    [
        ({"backend": "redis"}, "backend redis needs a url"),
        ({"backend": "memcached", "url": "x"}, "backend"),
        ({"backend": "redis", "url": "redis://r", "ttl": 3}, "Extra inputs are not permitted"),
        ({"backend": "redis", "url": "redis://r", "sync_interval_s": 0}, "greater than 0"),
        ({"backend": "redis", "url": "redis://r", "peer_ttl_s": 2}, "at least 3 x"),
        ({"backend": "redis", "url": "redis://r", "key_prefix": "a b"}, "pattern"),
    ],
)
def test_a_bad_state_block_is_a_config_error(state: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        parse_config(BASE | {"state": state})


def test_the_default_is_embedded() -> None:
    assert parse_config(BASE).state.backend == "embedded"


def test_a_password_never_shows() -> None:
    assert redacted("rediss://:s3cret@cache:6380/0") == "rediss://:***@cache:6380/0"
    assert redacted("redis://u:pw@h/1") == "redis://u:***@h/1"
    assert redacted("redis://h:6379/0") == "redis://h:6379/0"


async def test_a_replica_without_its_redis_starts_serves_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.state.sync")
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"  # nothing listens there
    started = time.monotonic()
    config = redis_config(local_config(), url, sync_interval_s=0.2)
    async with in_process(gateway_settings(replica_id="lonely"), config) as gw:
        assert time.monotonic() - started < 10
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(5):
            assert (await gw.client.post("/v1/chat/completions", json=chat)).status_code == 200
            await asyncio.sleep(0.2)  # a sync fails meanwhile
        state = (await gw.client.get("/routes")).json()["state"]
        assert state["backend"] == "redis" and state["up"] is False
        assert state["url"] == url.replace("hunter2", "***") and state["replica"] == "lonely"
        assert state["failures"] >= 3 and "Connect" in state["error"]
        metrics = (await gw.client.get("/metrics")).text
        assert 'specgate_state_backend_up{backend="redis"} 0.0' in metrics
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "hunter2" not in warned[0]  # once, not per sync or request


async def test_embedded_shows_up() -> None:
    async with in_process(gateway_settings()) as gw:
        assert (await gw.client.get("/routes")).json()["state"] == {
            "backend": "embedded",
            "up": True,
        }
        metrics = (await gw.client.get("/metrics")).text
        assert 'specgate_state_backend_up{backend="embedded"} 1.0' in metrics
