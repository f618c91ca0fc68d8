"""The gate's arithmetic, verdict, table and prompt loading (no servers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.drafts.commands import parse_ks
from backends.drafts.gate import load_gate_prompts
from backends.drafts.gate_report import (
    TaskTiming,
    counter_delta,
    render_table,
    spec_counters,
    summarise_k,
    verdict,
)

METRICS = """# HELP vllm:spec_decode_num_drafts_total Drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {tokens}
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="0"}} {p0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="1"}} {p1}
"""


def metrics(drafts: int, tokens: int, accepted: int, p0: int, p1: int) -> str:
    return METRICS.format(drafts=drafts, tokens=tokens, accepted=accepted, p0=p0, p1=p1)


def timing(same: int, prompts: int, plain_s: float, head_s: float) -> TaskTiming:
    t = TaskTiming()
    for i in range(prompts):
        t.add(i < same, 100, plain_s / prompts, head_s / prompts, f"#{i}")
    return t


def test_counter_deltas_give_acceptance_figures() -> None:
    before = spec_counters(metrics(10, 20, 5, 4, 1))
    after = spec_counters(metrics(110, 220, 155, 90, 65))
    delta = counter_delta(after, before)
    tasks = {"chat": timing(2, 2, 3.0, 2.0), "code": timing(2, 2, 2.0, 2.0)}
    result = summarise_k(2, delta, tasks)
    assert result["acceptance_rate"] == 0.75  # 150 / 200
    assert result["mean_acceptance_length"] == 2.5  # 1 + 150 / 100
    assert result["accepted_per_position"] == [0.86, 0.64]
    assert result["speedup_vs_plain"] == {"chat": 1.5, "code": 1.0}
    assert result["mean_speedup"] == 1.25 and result["identical"] == 4


def test_a_plain_server_has_zero_counters() -> None:
    counters = spec_counters(
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n"
    )
    assert counters.drafts == 0 and counters.accepted_per_pos == ()


def _result(k: int, same: int, plain_s: float, head_s: float, accepted: int = 50) -> dict:
    counters = spec_counters(metrics(100, 100 * k, accepted, accepted, 0))
    return summarise_k(k, counters, {"chat": timing(same, 4, plain_s, head_s)})


def test_verdict_refuses_any_difference() -> None:
    decision = verdict([_result(1, 4, 2.0, 1.0), _result(3, 3, 2.0, 1.0)])
    assert decision["status"] == "refused" and "k=[3]" in decision["reason"]
    table = render_table([_result(3, 3, 2.0, 1.0)], decision)
    assert "k=3 differs: #3" in table and "verdict: refused" in table


def test_verdict_picks_the_fastest_k() -> None:
    decision = verdict([_result(1, 4, 2.0, 1.6), _result(2, 4, 2.0, 1.0), _result(3, 4, 2.0, 1.2)])
    assert decision == {"status": "pass", "best_k": 2, "reason": "2.0x plain"}


def test_slow_or_never_accepting_heads_are_not_worth_serving() -> None:
    assert verdict([_result(3, 4, 2.0, 1.9)])["status"] == "not worth serving"
    untrained = _result(3, 4, 2.0, 1.0, accepted=0)
    assert verdict([untrained])["status"] == "not worth serving"
    assert "accepted tokens: 0" in verdict([untrained])["reason"]


def test_gate_prompts_skip_multi_turn_completion_and_long(tmp_path: Path) -> None:
    lines = [
        {"prompt": "a"},
        {"prompt": "b", "turns": [1]},
        {"prompt": "c", "prompt_format": "completion"},
        {"prompt": "x" * 5000},
        {"prompt": "d"},
        {"prompt": "e"},
    ]
    for task in ("chat", "code"):
        (tmp_path / f"{task}.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    prompts = load_gate_prompts(tmp_path, 2)
    assert prompts == [("chat", "a"), ("chat", "d"), ("code", "a"), ("code", "d")]


def test_gate_prompts_bad_line_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="chat.jsonl: missing"):
        load_gate_prompts(tmp_path, 2)
    (tmp_path / "chat.jsonl").write_text('{"prompt": "a"}\n{oops\n')
    with pytest.raises(ValueError, match=r"chat.jsonl:2: bad prompt line"):
        load_gate_prompts(tmp_path, 2)


@pytest.mark.parametrize(("text", "ks"), [("1,2,3", (1, 2, 3)), ("3", (3,)), (" 2, 4", (2, 4))])
def test_parse_ks(text: str, ks: tuple[int, ...]) -> None:
    assert parse_ks(text) == ks


@pytest.mark.parametrize("text", ["", "a", "0", "1,40"])
def test_parse_ks_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="--k"):
        parse_ks(text)
