"""The gateway's /metrics in process: request counts by backend, rule, task and status,
histogram counts, and backend gauges read from the live state at scrape time."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import prometheus_client
from prometheus_client.parser import text_string_to_metric_families

from contracts.config import parse_config
from gateway.trace import RequestTrace
from tests.fakes.vllm_metrics import vllm_metrics_page
from tests.unit.conftest import MODEL, InProcess

DATA = Path(__file__).resolve().parents[1] / "data"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(gw: InProcess) -> Samples:
    """Every sample of the gateway's /metrics, keyed by (sample name, labels)."""
    resp = await gw.client.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(resp.text)
        for s in family.samples
    }


def select(samples: Samples, name: str, **labels: str) -> dict[frozenset, float]:  # type: ignore[type-arg]
    """Samples named ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return {lab: v for (n, lab), v in samples.items() if n == name and want <= lab}


async def send_mix(gw: InProcess) -> tuple[Counter[tuple[str, str, str, str]], list[RequestTrace]]:
    """Code, creative, chat (streamed), an unknown model and a backend 400; returns the
    expected (backend, rule, task, status) counts from the responses, and the traces."""
    traces: list[RequestTrace] = []
    gw.app.state.runtime.gateway.observers.append(traces.append)
    expected: Counter[tuple[str, str, str, str]] = Counter()
    code = {"model": MODEL, "prompt": "def f(x):", "max_tokens": 8, "temperature": 0}
    sends = [(code, "code")] * 3 + [(code | {"temperature": 1.0}, "creative")] * 2
    sends += [(code | {"stream": True, "temperature": 0.2}, "chat")]
    for body, task in sends:
        resp = await gw.client.post("/v1/completions", json=body, headers={"x-task-type": task})
        h = resp.headers
        key = (h["x-specgate-backend"], h["x-specgate-rule"], h["x-specgate-task"])
        expected[(*key, str(resp.status_code))] += 1
    resp = await gw.client.post("/v1/completions", json=code | {"model": "nope"})
    assert resp.status_code == 404
    expected[("none", "none", "none", "404")] += 1
    gw.fakes["plain"].status = 400
    resp = await gw.client.post("/v1/completions", json=code, headers={"x-task-type": "chat"})
    assert resp.status_code == 400
    expected[("plain", "default", "chat", "400")] += 1
    return expected, traces


async def test_request_counts_by_backend_rule_task_status(gw: InProcess) -> None:
    expected, traces = await send_mix(gw)
    samples = await scrape(gw)
    counted = {
        tuple(dict(lab)[k] for k in ("backend", "rule", "task", "status")): v
        for lab, v in select(samples, "specgate_requests_total").items()
    }
    assert counted == dict(expected)
    assert sum(counted.values()) == 8 == len(traces)
    assert {k[0] for k in expected} >= {"plain", "none"}


async def test_histogram_counts_and_tokens_match_the_traces(gw: InProcess) -> None:
    _, traces = await send_mix(gw)
    samples = await scrape(gw)
    for backend, task in {(t.backend or "none", t.task or "none") for t in traces}:
        mine = [t for t in traces if (t.backend or "none", t.task or "none") == (backend, task)]
        labels = {"backend": backend, "task": task}

        def count(name: str, labels: dict[str, str] = labels) -> float:
            return sum(select(samples, name, **labels).values())

        assert count("specgate_request_duration_seconds_count") == len(mine)
        ttft = [t for t in mine if t.ttft_s is not None]
        assert count("specgate_time_to_first_token_seconds_count") == len(ttft)
        gaps = sum(len(t.gaps_s) for t in mine)
        assert count("specgate_inter_token_latency_seconds_count") == gaps
        tokens = sum(t.completion_tokens() or 0 for t in mine)
        assert count("specgate_completion_tokens_total") == tokens
    assert sum(select(samples, "specgate_completion_tokens_total").values()) == 8 * 5
    inf = select(samples, "specgate_request_duration_seconds_bucket", le="+Inf")
    assert sum(inf.values()) == 8


async def test_backend_gauges_follow_the_live_state(gw: InProcess) -> None:
    gw.fakes["plain"].metrics_text = vllm_metrics_page(running=3, waiting=2, kv_cache_usage=0.5)
    gw.fakes["ngram"].metrics_text = (DATA / "vllm-ngram-metrics-before.txt").read_text()
    await gw.poll()
    gw.fakes["ngram"].metrics_text = (DATA / "vllm-ngram-metrics-after.txt").read_text()
    gw.fakes["draft"].healthy = False
    await gw.poll()
    samples = await scrape(gw)

    def gauge(name: str, backend: str) -> float:
        [value] = select(samples, f"specgate_backend_{name}", backend=backend).values()
        return value

    assert (gauge("running", "plain"), gauge("waiting", "plain")) == (3.0, 2.0)
    assert gauge("kv_cache_usage", "plain") == 0.5
    assert (gauge("healthy", "plain"), gauge("healthy", "draft")) == (1.0, 0.0)
    routes = (await gw.client.get("/routes")).json()
    ngram = next(b for b in routes["backends"] if b["name"] == "ngram")
    assert gauge("acceptance_rate", "ngram") == ngram["acceptance"]["rate"] == 59 / 90
    assert gauge("mean_acceptance_length", "ngram") == ngram["acceptance"]["mean_length"]
    assert gauge("speculative_tokens", "ngram") == 5.0
    assert gauge("recommended_speculative_tokens", "ngram") == ngram["advice"]["recommended_k"]
    assert ngram["advice"]["reason"] == "18 drafts measured, 50 needed: keep k=5"
    assert not select(samples, "specgate_backend_acceptance_rate", backend="plain")
    per_pos = select(samples, "specgate_backend_acceptance_per_position", backend="ngram")
    assert sorted(per_pos.values()) == sorted(v for v in ngram["acceptance"]["per_position"])
    assert all(gauge("circuit_open", b) == 0.0 for b in ("plain", "ngram", "draft", "eagle3"))


async def test_circuit_and_inflight_gauges(gw: InProcess) -> None:
    state = gw.app.state.runtime.gateway.registry.states["ngram"]
    for _ in range(state.circuit.failure_threshold):
        state.circuit.on_failure(time.monotonic())
    state.inflight = 2
    samples = await scrape(gw)
    assert select(samples, "specgate_backend_circuit_open", backend="ngram").popitem()[1] == 1.0
    assert select(samples, "specgate_backend_inflight", backend="ngram").popitem()[1] == 2.0
    state.inflight = 0


async def test_backends_follow_a_config_reload(gw: InProcess) -> None:
    gateway = gw.app.state.runtime.gateway
    data = {
        "defaults": {"pool": "p"},
        "backends": {
            "plain": {"url": "http://127.0.0.1:8001", "model": MODEL},
            "eagle": {
                "url": "http://127.0.0.1:8009",
                "model": MODEL,
                "speculation": {"method": "eagle", "model": "head", "num_speculative_tokens": 4},
            },
        },
        "pools": {"p": ["plain", "eagle"]},
    }
    gateway.config = parse_config(data)
    gateway.registry.sync(gateway.config.backends)
    samples = await scrape(gw)
    info = select(samples, "specgate_backend_info")
    assert {dict(lab)["backend"]: dict(lab)["method"] for lab in info} == {
        "plain": "none",
        "eagle": "eagle",
    }


async def test_registry_is_the_apps_own(gw: InProcess) -> None:
    names = {m.name for m in prometheus_client.REGISTRY.collect()}
    assert not any(n.startswith("specgate_") for n in names)
    assert gw.app.state.runtime.metrics.registry is not prometheus_client.REGISTRY
