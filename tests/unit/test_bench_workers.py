"""``bench.gateway_workers`` and ``bench.bare_proxy --workers``: the two relays of the tenth GPU
run (docs/benchmarks.md section 7) that take requests in more than one uvicorn worker
process, run as that run started them, in front of :mod:`bench.fake_upstream`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from openai import OpenAI

from bench.fake_upstream import MODEL
from bench.targets import specgate_config
from tests.fakes.servers import free_port, stop_process


def _wait_up(url: str, process: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"exited with {process.returncode}"
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} did not answer /health within {timeout_s} s")


def _start(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", *argv],
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


@pytest.fixture
def upstreams() -> Iterator[list[str]]:
    ports = [free_port() for _ in range(3)]
    flags = [f"--port={p}" for p in ports]
    fake = _start(["bench.fake_upstream", *flags, "--tokens", "8"])
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        _wait_up(urls[0], fake)
        yield urls
    finally:
        stop_process(fake)


def _streamed_words(base_url: str) -> list[str]:
    client = OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=30)
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8, stream=True
    )
    return [c.choices[0].delta.content or "" for c in stream if c.choices]


def test_bare_proxy_in_two_workers_relays_streams(upstreams: list[str]) -> None:
    port = free_port()
    proxy = _start(
        ["bench.bare_proxy", "--upstream", upstreams[0], "--port", str(port), "--workers", "2"]
    )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_up(url, proxy)
        for _ in range(4):  # new connections each time: whichever worker takes them
            assert "".join(_streamed_words(url)).split() == [f"w{i}" for i in range(8)]
    finally:
        stop_process(proxy)


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
    gateway = _start(["bench.gateway_workers", "--workers", "2"], env)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_up(url, gateway)
        for _ in range(4):
            assert "".join(_streamed_words(url)).split() == [f"w{i}" for i in range(8)]
        routes = httpx.get(f"{url}/routes", timeout=5).json()  # one worker's view
        assert {b["name"] for b in routes["backends"]} == {"plain", "ngram", "draft"}
    finally:
        stop_process(gateway)
