"""docker/grafana-dashboard.json: valid JSON whose every query names metrics the gateway
really exports (scraped in process after traffic and a poll of speculative backends)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.fakes.vllm_metrics import vllm_metrics_page
from tests.unit.conftest import MODEL, InProcess

DASHBOARD = Path(__file__).resolve().parents[2] / "docker" / "grafana-dashboard.json"
METRIC = re.compile(r"\bspecgate_[a-zA-Z0-9_]+")


def dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and panels
    for panel in panels:
        assert panel["targets"] and {"x", "y", "w", "h"} <= set(panel["gridPos"])
        assert panel["datasource"]["uid"] == "${datasource}"
    return [t["expr"] for p in panels for t in p["targets"]]


async def test_every_dashboard_metric_is_exported(gw: InProcess) -> None:
    for name, k in (("ngram", 5), ("draft", 3), ("eagle3", 3)):
        gw.fakes[name].metrics_text = vllm_metrics_page(drafts=0, accepted_per_pos=(0,) * k)
    await gw.poll()
    for name, k in (("ngram", 5), ("draft", 3), ("eagle3", 3)):
        gw.fakes[name].metrics_text = vllm_metrics_page(drafts=100, accepted_per_pos=(50,) * k)
    await gw.poll()
    body = {"model": MODEL, "prompt": "def f():", "max_tokens": 4, "temperature": 0}
    await gw.client.post("/v1/completions", json=body, headers={"x-task-type": "code"})
    await gw.client.post("/v1/completions", json=body | {"stream": True})
    text = (await gw.client.get("/metrics")).text
    exported = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    used = {name for expr in dashboard_exprs() for name in METRIC.findall(expr)}
    assert len(used) >= 15
    assert used <= exported, sorted(used - exported)
