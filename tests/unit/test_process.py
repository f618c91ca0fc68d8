"""`specgate serve` as a real process: SIGHUP reloads, SIGTERM drains streams in flight."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.fakes.fake_vllm import FakeBehaviour, create_fake_vllm
from tests.fakes.servers import free_port, running_server

MODEL = "smollm2-135m-instruct"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes], Path, FakeBehaviour]]:
    fake = FakeBehaviour(name="plain", tokens=10, delay_s=0.2)
    with running_server(create_fake_vllm(fake)) as backend:
        config = tmp_path / "gateway.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "defaults": {"pool": "p"},
                    "backends": {"plain": {"url": backend, "model": MODEL}},
                    "pools": {"p": ["plain"]},
                    "rules": [{"name": "first", "pool": "p"}],
                }
            )
        )
        port = free_port()
        env = os.environ | {"SPECGATE_SHUTDOWN_GRACE_S": "10"}
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gateway",
                "serve",
                "--config",
                str(config),
                "--port",
                str(port),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    if httpx.get(f"{url}/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.1)
            yield url, proc, config, fake
        finally:
            proc.kill()
            proc.wait()


def test_sighup_reloads_the_config(
    served: tuple[str, subprocess.Popen[bytes], Path, FakeBehaviour],
) -> None:
    url, proc, config, _ = served
    data = yaml.safe_load(config.read_text())
    data["rules"][0]["name"] = "renamed"
    config.write_text(yaml.safe_dump(data))
    proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while [r["name"] for r in httpx.get(f"{url}/routes").json()["rules"]][0] != "renamed":
        assert time.monotonic() < deadline, "SIGHUP did not reload"
        time.sleep(0.1)
    config.write_text("not: [valid")  # an invalid file is refused, the process lives on
    proc.send_signal(signal.SIGHUP)
    time.sleep(0.5)
    assert httpx.get(f"{url}/routes").json()["rules"][0]["name"] == "renamed"


def test_sigterm_lets_a_stream_in_flight_finish(
    served: tuple[str, subprocess.Popen[bytes], Path, FakeBehaviour],
) -> None:
    url, proc, _, _ = served
    lines: list[str] = []
    first_chunk = threading.Event()

    def consume() -> None:
        body = {"model": MODEL, "prompt": "x", "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as resp:
            for line in resp.iter_lines():
                if line:
                    lines.append(line)
                    first_chunk.set()

    reader = threading.Thread(target=consume)
    reader.start()
    assert first_chunk.wait(10)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    with pytest.raises(httpx.TransportError):  # no new connections while draining
        httpx.get(f"{url}/health", timeout=1)
    reader.join(20)
    assert lines[-1] == "data: [DONE]" and len(lines) == 11  # the stream finished whole
    assert proc.wait(15) in (0, -signal.SIGTERM)  # uvicorn re-raises SIGTERM after draining
