"""``bench.gateway_workers`` and ``bench.bare_proxy --workers``: the two relays of the tenth GPU
run (docs/benchmarks.md section 7) that take requests in more than one uvicorn worker
process, run as that run started them, in front of :mod:`bench.fake_upstream`."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from openai import OpenAI

from bench.fake_upstream import MODEL
from bench.procs import Server
from bench.targets import specgate_config
from tests.fakes.servers import free_port


@pytest.fixture
def upstreams(tmp_path: Path) -> Iterator[list[str]]:
    ports = [free_port() for _ in range(3)]
    flags = [f"--port={p}" for p in ports]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    argv = [sys.executable, "-m", "bench.fake_upstream", *flags, "--tokens", "8"]
    with Server("fake", argv, ready_url=f"{urls[0]}/health", log_path=tmp_path / "fake.log"):
        yield urls


def _streamed_words(base_url: str) -> list[str]:
    client = OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=30)
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8, stream=True
    )
    return [c.choices[0].delta.content or "" for c in stream if c.choices]


def test_bare_proxy_in_two_workers_relays_streams(upstreams: list[str], tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "bench.bare_proxy", "--upstream", upstreams[0]]
    argv += ["--port", str(port), "--workers", "2"]
    with Server("bare", argv, ready_url=f"{url}/health", log_path=tmp_path / "bare.log"):
        for _ in range(4):  # new connections each time: whichever worker takes them
            assert "".join(_streamed_words(url)).split() == [f"w{i}" for i in range(8)]


def test_gateway_in_two_workers_routes_and_relays(upstreams: list[str], tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump(specgate_config(upstreams), sort_keys=False))
    port = free_port()
    env = {
        "SPECGATE_CONFIG": str(config),
        "SPECGATE_PORT": str(port),
        "SPECGATE_STATE_PERSIST": "false",
        "SPECGATE_SAMPLE_CANARY_INTERVAL_S": "0",
        "SPECGATE_CACHE_DIR": str(tmp_path / "cache"),
    }
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "bench.gateway_workers", "--workers", "2"]
    log = tmp_path / "gateway.log"
    with Server("gateway", argv, ready_url=f"{url}/ready", log_path=log, env=env):
        for _ in range(4):
            assert "".join(_streamed_words(url)).split() == [f"w{i}" for i in range(8)]
        routes = httpx.get(f"{url}/routes", timeout=5).json()  # one worker's view
        assert {b["name"] for b in routes["backends"]} == {"plain", "ngram", "draft"}
