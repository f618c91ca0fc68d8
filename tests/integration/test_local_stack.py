"""The main job end to end: OpenAI SDK -> specgate -> real vLLM CPU backends."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from contracts.config import GatewayConfig, parse_config
from gateway.app import create_app
from gateway.settings import Settings
from tests.fakes.servers import free_port, running_server
from tests.integration.conftest import MODEL, backend_url, local_config_data

pytestmark = pytest.mark.integration

#: The seed's request: a prompt, 200 tokens, greedy.
SEED_BODY = {
    "model": MODEL,
    "prompt": "Write a Python function that checks whether a number is prime.",
    "max_tokens": 200,
    "temperature": 0,
}
GREEDY_PROMPTS = [
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "The capital of France is",
    "Question: What is 12 times 12?\nAnswer:",
    "import json\n\ndata = {'a': 1, 'b': 2}\nprint(json.dumps(data",
]


def sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture
def client(gateway_url: str) -> Iterator[openai.OpenAI]:
    with sdk(gateway_url) as c:
        yield c


def test_completions_streamed_equals_non_streamed(client: openai.OpenAI) -> None:
    kwargs = {"model": MODEL, "prompt": GREEDY_PROMPTS[0], "max_tokens": 24, "temperature": 0}
    whole = client.completions.create(**kwargs)
    parts = client.completions.create(**kwargs, stream=True)
    streamed = "".join(chunk.choices[0].text for chunk in parts if chunk.choices)
    assert whole.choices[0].text
    assert streamed == whole.choices[0].text


def test_chat_streamed_equals_non_streamed(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    whole = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=24, temperature=0
    )
    text = whole.choices[0].message.content or ""
    assert "Paris" in text
    chunks = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage = [], None
    for chunk in chunks:
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
        usage = chunk.usage or usage
    assert "".join(pieces) == text
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens


def test_seed_request_returns_a_completion(gateway_url: str) -> None:
    resp = httpx.post(f"{gateway_url}/v1/completions", json=SEED_BODY, timeout=300)
    assert resp.status_code == 200
    body = resp.json()
    assert body["choices"][0]["text"].strip()
    assert 0 < body["usage"]["completion_tokens"] <= 200
    assert resp.headers["x-specgate-task"] == "code"


@pytest.mark.parametrize("speculative", ["ngram", "draft", "eagle3"])
def test_speculation_is_lossless_in_float32(stack_config: GatewayConfig, speculative: str) -> None:
    """Greedy token ids through each speculative backend equal the plain backend's."""
    for prompt in GREEDY_PROMPTS:
        body = {
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": 32,
            "temperature": 0,
            "return_token_ids": True,
        }
        plain = httpx.post(
            f"{backend_url(stack_config, 'plain')}/v1/completions", json=body, timeout=300
        ).json()["choices"][0]
        spec = httpx.post(
            f"{backend_url(stack_config, speculative)}/v1/completions", json=body, timeout=300
        ).json()["choices"][0]
        assert spec["text"] == plain["text"]
        assert spec["token_ids"] == plain["token_ids"]


def test_task_header_routes_and_routes_counts(gateway_url: str, client: openai.OpenAI) -> None:
    before = httpx.get(f"{gateway_url}/routes").json()["decisions"]
    creative = client.completions.with_raw_response.create(
        model=MODEL,
        prompt="Once upon a time",
        max_tokens=8,
        temperature=1.0,
        extra_headers={"X-Task-Type": "creative"},
    )
    assert creative.headers["x-specgate-backend"] == "plain"
    assert creative.headers["x-specgate-rule"] == "creative-plain"
    code = client.completions.with_raw_response.create(
        model=MODEL,
        prompt=GREEDY_PROMPTS[0],
        max_tokens=8,
        temperature=0,
        extra_headers={"X-Task-Type": "code"},
    )
    chosen = code.headers["x-specgate-backend"]
    # the rule's speculative pool, or its plain fallback once adaptive routing (the shipped
    # default) has measured code on this module's gateway and found plain faster
    assert chosen in {"eagle3", "ngram", "draft", "plain"}
    assert code.headers["x-specgate-rule"] == "code-rag-speculative"
    after = httpx.get(f"{gateway_url}/routes").json()
    by_rule = after["decisions"]["by_rule"]
    assert by_rule["creative-plain"] == before["by_rule"].get("creative-plain", 0) + 1
    assert by_rule["code-rag-speculative"] == before["by_rule"].get("code-rag-speculative", 0) + 1
    served = {b["name"]: b["requests"] for b in after["backends"]}
    # the creative request went to plain too
    assert served[chosen] == before["by_backend"].get(chosen, 0) + 1 + (chosen == "plain")
    assert all(b["healthy"] for b in after["backends"])


def test_stopped_backend_fails_over_and_all_stopped_is_503(stack_config: GatewayConfig) -> None:
    data = local_config_data()  # real backends: rewrite their URLs to the running ones
    for name in data["backends"]:
        data["backends"][name] = {"url": backend_url(stack_config, name), "model": MODEL}
    data["backends"]["stopped"] = {"url": f"http://127.0.0.1:{free_port()}", "model": MODEL}
    data["pools"]["speculative"] = ["stopped", "ngram"]
    config = parse_config(data)
    settings = Settings(health_interval_s=60, state_persist=False, sample_canary_interval_s=0)
    with running_server(create_app(settings, config=config)) as url, sdk(url) as c:
        resp = c.completions.with_raw_response.create(
            model=MODEL,
            prompt="def add(a, b):",
            max_tokens=8,
            temperature=0,
            extra_headers={"X-Task-Type": "code"},
        )
        assert resp.headers["x-specgate-backend"] == "ngram"
        assert httpx.get(f"{url}/ready").status_code == 200
    dead = {
        "defaults": {"pool": "p"},
        "pools": {"p": ["a", "b"]},
        "backends": {
            n: {"url": f"http://127.0.0.1:{free_port()}", "model": MODEL} for n in ("a", "b")
        },
    }
    with running_server(create_app(settings, config=parse_config(dead))) as url, sdk(url) as c:
        with pytest.raises(openai.APIStatusError) as info:
            c.completions.create(model=MODEL, prompt="hi", max_tokens=4)
        assert info.value.status_code == 503
        assert info.value.body["code"] == "no_healthy_backend"  # type: ignore[index]
        assert httpx.get(f"{url}/ready").status_code == 503
