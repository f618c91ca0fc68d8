"""A client that goes away cancels the generation on real vLLM (num_requests_running -> 0),
on the routed endpoints and on a relayed path (``/invocations``, vLLM's SageMaker route)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from contracts.config import GatewayConfig
from contracts.vllm_metrics import parse_vllm_metrics
from tests.integration.conftest import MODEL, backend_url

pytestmark = pytest.mark.integration

LONG = {
    "model": MODEL,
    "prompt": "Write a very long story about a lighthouse keeper.",
    "max_tokens": 2000,
    "temperature": 1.0,
    "ignore_eos": True,
}


def running(url: str) -> float:
    return parse_vllm_metrics(httpx.get(f"{url}/metrics").text).running


async def wait_until_running(url: str) -> None:
    deadline = time.monotonic() + 30
    while running(url) < 1:
        assert time.monotonic() < deadline, "the generation never started"
        await asyncio.sleep(0.1)


async def seconds_until_idle(url: str) -> float:
    gone = time.monotonic()
    while running(url) > 0:
        assert time.monotonic() - gone < 10, "vLLM kept generating after the client left"
        await asyncio.sleep(0.05)
    return time.monotonic() - gone


@pytest.mark.parametrize(
    ("path", "stream"),
    [
        ("/v1/completions", True),
        ("/v1/completions", False),
        ("/invocations", False),  # relayed: vLLM generated on for 55-80 s (issue #26)
        ("/invocations", True),
    ],
)
async def test_client_leaving_aborts_the_generation(
    stack_config: GatewayConfig, gateway_url: str, path: str, stream: bool
) -> None:
    plain = backend_url(stack_config, "plain")  # creative at 1.0 goes there; relayed: plain first
    async with httpx.AsyncClient(base_url=gateway_url, timeout=60) as client:
        request = client.post(
            path, json=LONG | {"stream": stream}, headers={"X-Task-Type": "creative"}
        )
        task = asyncio.ensure_future(request)
        await wait_until_running(plain)
        task.cancel()  # the client goes away mid-generation
        with pytest.raises(asyncio.CancelledError):
            await task
    idle_s = await seconds_until_idle(plain)
    print(f"\n{path} stream={stream}: vLLM idle {idle_s:.2f} s after the client left")
    assert idle_s < 2.0
