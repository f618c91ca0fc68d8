"""/status in process (the browser test is tests/unit/test_status_browser.py), the
acceptance history and the sparkline geometry."""

from __future__ import annotations

from pathlib import Path

from contracts.acceptance import AcceptanceStats
from gateway.telemetry.history import AcceptanceHistory
from gateway.telemetry.status import SPARK_H, SPARK_W, sparkline
from gateway.upstream.state import BackendRegistry
from tests.unit.conftest import MODEL, InProcess

DATA = Path(__file__).resolve().parents[1] / "data"


def stats(rate: float) -> AcceptanceStats:
    return AcceptanceStats(rate, 1 + 5 * rate, 10, 50, 50 * rate, ())


def test_sparkline_geometry() -> None:
    assert sparkline([], 100.0, 60.0, None) is None
    line = sparkline([(40.0, 1.0), (70.0, 0.5), (100.0, 0.0)], 100.0, 600.0, 0.25)
    assert line is not None
    # The history is younger than the span: x covers its 60 s.
    assert line.points == f"0.0,0.0 {SPARK_W / 2},{SPARK_H / 2} {float(SPARK_W)},{float(SPARK_H)}"
    assert (line.floor_y, line.low, line.high, line.last) == (SPARK_H * 0.75, 0.0, 1.0, 0.0)
    one = sparkline([(99.0, 0.5)], 100.0, 600.0, None)
    assert one is not None and one.points == f"0,{SPARK_H / 2} {SPARK_W},{SPARK_H / 2}"


def test_history_is_bounded_and_follows_the_registry() -> None:
    registry = BackendRegistry(["plain", "ngram"])
    clock = [0.0]
    history = AcceptanceHistory(registry, span_s=10, interval_s=1, clock=lambda: clock[0])
    for i in range(30):
        clock[0] = float(i)
        registry.states["ngram"].acceptance = stats(i / 100)
        history.sample()
    assert set(history.series) == {"ngram"}  # plain has no acceptance
    assert len(history.series["ngram"]) == history.maxlen == 11
    assert [t for t, _ in history.recent("ngram")] == [float(i) for i in range(19, 30)]
    registry.sync(["plain"])
    history.sample()
    assert history.series == {}


async def test_status_page_renders_the_live_state(gw: InProcess) -> None:
    gw.fakes["ngram"].metrics_text = (DATA / "vllm-ngram-metrics-before.txt").read_text()
    await gw.poll()
    gw.fakes["ngram"].metrics_text = (DATA / "vllm-ngram-metrics-after.txt").read_text()
    gw.fakes["draft"].healthy = False
    await gw.poll()
    gw.app.state.runtime.history.sample()
    body = {"model": MODEL, "prompt": "x", "max_tokens": 4, "temperature": 0}
    await gw.client.post("/v1/completions", json=body, headers={"x-task-type": "code"})
    gw.app.state.runtime.gateway.registry.states["plain"].last_error = "<script>alert(1)</script>"
    resp = await gw.client.get("/status")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/html")
    html = resp.text
    assert '<meta http-equiv="refresh"' in html
    for name in ("plain", "ngram", "draft", "eagle3"):
        assert f'<tr data-backend="{name}">' in html
    assert "65.6%" in html and "4.28" in html  # 59/90 accepted, 1 + 59/18 tokens per step
    assert '<span class="pill down"' in html  # draft
    assert "<polyline" in html
    assert "18 drafts measured, 50 needed: keep k=5" in html
    assert "&lt;script&gt;" in html and "<script>" not in html
    assert 'code-rag-speculative</td><td class="num">1' in html
