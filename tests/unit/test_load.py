"""A bounded load test: ~200 concurrent mixed requests while a backend is killed and the
config is reloaded. Every request completes or fails cleanly; none is lost."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.app import create_app
from gateway.settings import Settings
from tests.fakes.servers import free_port, running_server

MODEL = "smollm2-135m-instruct"
REQUESTS = 200


def start_fake(name: str, port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.fakes.serve_fake",
            "--port",
            str(port),
            "--name",
            name,
            "--tokens",
            "40",
            "--delay-s",
            "0.05",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_up(port: int) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline
        time.sleep(0.05)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[str, Path, dict[str, subprocess.Popen[bytes]]]]:
    ports = {name: free_port() for name in ("plain", "ngram", "draft")}
    procs = {name: start_fake(name, port) for name, port in ports.items()}
    try:
        for port in ports.values():
            wait_up(port)
        config = tmp_path / "gateway.yaml"
        spec = {"method": "ngram", "num_speculative_tokens": 3}
        config.write_text(
            yaml.safe_dump(
                {
                    "defaults": {"pool": "all"},
                    "backends": {
                        n: {"url": f"http://127.0.0.1:{p}", "model": MODEL}
                        | ({"speculation": spec} if n != "plain" else {})
                        for n, p in ports.items()
                    },
                    "pools": {"all": ["plain", "ngram", "draft"], "spec": ["ngram", "draft"]},
                    "rules": [
                        {
                            "name": "code",
                            "match": {"tasks": ["code"]},
                            "pool": "spec",
                            "fallbacks": ["all"],
                        }
                    ],
                }
            )
        )
        settings = Settings(config=config, health_interval_s=0.5, max_inflight=1000)
        with running_server(create_app(settings)) as url:
            yield url, config, procs
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


def classify(status: int, body: bytes, stream: bool) -> str:
    """completed, failed_cleanly (OpenAI envelope or error event + [DONE]) or lost."""
    text = body.decode(errors="replace")
    if status != 200:
        try:
            error = json.loads(text)["error"]
            return "failed_cleanly" if {"message", "type", "code"} <= set(error) else "lost"
        except (ValueError, KeyError, TypeError):
            return "lost"
    if not stream:
        try:
            return "completed" if json.loads(text)["choices"] else "lost"
        except (ValueError, KeyError):
            return "lost"
    events = [e for e in text.split("\n\n") if e.strip()]
    if not events or events[-1] != "data: [DONE]":
        return "lost"
    return "failed_cleanly" if any('"error"' in e for e in events[:-1]) else "completed"


async def one(client: httpx.AsyncClient, url: str, i: int, rng: random.Random) -> str:
    stream = i % 2 == 0
    chat = rng.random() < 0.5
    task = rng.choice(["code", "chat"])
    body = {"model": MODEL, "max_tokens": 16, "temperature": 0, "stream": stream}
    if chat:
        body["messages"] = [{"role": "user", "content": f"request {i}"}]
    else:
        body["prompt"] = f"request {i}"
    path = "/v1/chat/completions" if chat else "/v1/completions"
    try:
        async with client.stream(
            "POST", f"{url}{path}", json=body, headers={"X-Task-Type": task}
        ) as resp:
            raw = await resp.aread()
        return classify(resp.status_code, raw, stream)
    except httpx.HTTPError:
        return "lost"


async def inflight(client: httpx.AsyncClient, url: str, backend: str) -> int:
    views = (await client.get(f"{url}/routes")).json()["backends"]
    return next(int(b["inflight"]) for b in views if b["name"] == backend)


async def test_load_with_a_backend_killed_and_a_reload(
    fleet: tuple[str, Path, dict[str, subprocess.Popen[bytes]]],
) -> None:
    url, config, procs = fleet
    rng = random.Random(7)
    limits = httpx.Limits(max_connections=REQUESTS)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        tasks = [asyncio.ensure_future(one(client, url, i, rng)) for i in range(REQUESTS)]
        deadline = time.monotonic() + 30
        while await inflight(client, url, "ngram") < 5:  # streams are under way there
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        procs["ngram"].send_signal(signal.SIGKILL)  # a backend dies mid-run
        await asyncio.sleep(0.2)
        data = yaml.safe_load(config.read_text())  # noqa: ASYNC240 (tiny file)
        data["rules"][0]["name"] = "code-v2"
        config.write_text(yaml.safe_dump(data))  # noqa: ASYNC240
        reload = await client.post(f"{url}/routes/reload")
        assert reload.status_code == 200
        outcomes = Counter(await asyncio.gather(*tasks))
        routes = (await client.get(f"{url}/routes")).json()
        after = await client.post(
            f"{url}/v1/completions",
            headers={"X-Task-Type": "code"},
            json={"model": MODEL, "prompt": "after", "max_tokens": 4},
        )
    print(
        f"\nload test: sent {REQUESTS} / completed {outcomes['completed']} / "
        f"failed cleanly {outcomes['failed_cleanly']} / lost {outcomes['lost']} "
        f"(served by {routes['decisions']['by_backend']}, "
        f"failovers {routes['decisions']['failovers']})"
    )
    assert sum(outcomes.values()) == REQUESTS
    assert outcomes["lost"] == 0
    assert outcomes["completed"] >= REQUESTS // 2  # only streams on the killed backend fail
    assert after.status_code == 200 and after.headers["x-specgate-rule"] == "code-v2"
    assert after.headers["x-specgate-backend"] != "ngram"
