"""``specgate tune``: two reads of live /metrics (or cumulative since start), a table and the
``--speculative-config`` to use next."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from cli.main import main
from cli.tune import window_advice
from contracts.config import parse_config
from contracts.vllm_metrics import parse_vllm_metrics
from gateway.speculation.advisor import Knobs
from tests.fakes.servers import free_port, running_server
from tests.fakes.vllm_metrics import vllm_metrics_page

DATA = Path(__file__).resolve().parents[1] / "data"
MODEL = "smollm2-135m-instruct"
NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 5,
    "prompt_lookup_min": 2,
    "prompt_lookup_max": 4,
}


def metrics_sequence(*pages: str) -> Starlette:
    """A server whose /metrics answers ``pages`` in turn (the last one from then on)."""
    queue = list(pages)

    async def metrics(_: Request) -> PlainTextResponse:
        return PlainTextResponse(queue.pop(0) if len(queue) > 1 else queue[0])

    return Starlette(routes=[Route("/metrics", metrics)])


def test_recorded_pages() -> None:
    """Two real reads, 18 drafts apart (the first read is a fresh server: all zeros)."""
    before = parse_vllm_metrics((DATA / "vllm-ngram-metrics-before.txt").read_text()).spec
    after = parse_vllm_metrics((DATA / "vllm-ngram-metrics-after.txt").read_text()).spec
    assert before is not None and after is not None
    config = parse_config(
        {
            "defaults": {"pool": "p"},
            "backends": {"ngram": {"url": "http://x", "model": MODEL, "speculation": NGRAM}},
            "pools": {"p": ["ngram"]},
        }
    )
    backend = config.backends["ngram"]
    advice = window_advice(backend, before, after, 2.0)
    assert advice is not None and advice.window == "last 2 s"
    assert advice.reason == "18 drafts measured, 50 needed: keep k=5"
    advice = window_advice(backend, before, after, 2.0, Knobs(min_drafts=10))
    assert advice is not None and advice.window == "last 2 s"
    assert advice.rate == pytest.approx(59 / 90) and advice.recommended_k == 5


def test_cli_reads_live_backends_twice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ngram_pages = (
        vllm_metrics_page(drafts=1000, accepted_per_pos=(700, 600, 500, 400, 300)),
        vllm_metrics_page(drafts=2000, accepted_per_pos=(1440, 1210, 980, 790, 640)),
    )
    draft_page = vllm_metrics_page(drafts=400, accepted_per_pos=(12, 4, 2))
    with (
        running_server(metrics_sequence(*ngram_pages)) as ngram,
        running_server(metrics_sequence(draft_page)) as draft,
    ):
        config = {
            "defaults": {"pool": "p"},
            "backends": {
                "plain": {"url": f"http://127.0.0.1:{free_port()}", "model": MODEL},
                "ngram": {"url": ngram, "model": MODEL, "speculation": NGRAM},
                "draft": {
                    "url": draft,
                    "model": MODEL,
                    "speculation": {
                        "method": "draft_model",
                        "model": "d8",
                        "num_speculative_tokens": 3,
                    },
                },
            },
            "pools": {"p": ["plain", "ngram", "draft"]},
        }
        path = tmp_path / "gw.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        assert main(["tune", "--config", str(path), "--interval", "0.2"]) == 0
        out = capsys.readouterr().out
        assert main(["tune", "--config", str(path), "--interval", "0", "--json"]) == 0
        as_json = json.loads(capsys.readouterr().out)
    lines = out.splitlines()
    assert lines[0].split() == [
        "backend",
        "method",
        "k",
        "rate",
        "mean",
        "len",
        "tok/step",
        "now->next",
        "k",
        "next",
        "window",
    ]
    # ngram over the interval: 1000 drafts at 0.74 0.61 0.48 0.39 0.34 (the H200 figures).
    assert lines[1].split() == [
        "ngram",
        "ngram",
        "5",
        "51.2%",
        "3.56",
        "3.56",
        "->",
        "3.56",
        "5",
        "last",
        "0.2",
        "s",
    ]
    assert lines[2].split()[:3] == ["draft", "draft_model", "3"]
    assert lines[2].split()[-3:] == ["since", "server", "start"]  # constant counters
    assert "ngram: rate 51.2% between 50% and 70%, all 5 positions clear 0.30: keep k" in out
    next_config = '{"method":"draft_model","model":"d8","num_speculative_tokens":1}'
    assert f"  --speculative-config '{next_config}'" in out
    assert "change the draft" in out
    assert not any(line.startswith("plain") for line in lines)  # not speculative
    assert [r["backend"] for r in as_json] == ["ngram", "draft"]
    assert as_json[0]["advice"]["window"] == "since server start"
    assert as_json[0]["advice"]["rate"] == pytest.approx(5060 / 10000)  # the newest page


def test_cli_exit_1_when_a_backend_cannot_be_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = {
        "defaults": {"pool": "p"},
        "backends": {
            "ngram": {
                "url": f"http://127.0.0.1:{free_port()}",
                "model": MODEL,
                "speculation": NGRAM,
            },
        },
        "pools": {"p": ["ngram"]},
    }
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    assert main(["tune", "--config", str(path), "--interval", "0"]) == 1
    assert "ngram: not read (ConnectError" in capsys.readouterr().out
