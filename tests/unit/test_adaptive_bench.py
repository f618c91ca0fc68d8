"""The adaptive section of bench.speedup on synthetic outcomes: the oracle per task, the
targets, and the exploration cost (logic only; timings are never asserted)."""

from __future__ import annotations

from typing import Any

from bench import adaptive_bench, speedup_report
from bench.llm_client import Outcome


def outcome(task: str, backend: str | None, e2e: float, tokens: int = 64) -> dict[str, Any]:
    return Outcome(task, "x", 0.1, e2e, tokens, tokens, backend).to_json()


def run(target: str, outs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"target": target, "concurrency": 1, "wall_s": 1.0, "acceptance": {}, "outcomes": outs}


def test_checks_against_static_and_the_oracle() -> None:
    runs = [
        run("plain", [outcome("code", None, 4.0)]),
        run("ngram", [outcome("code", None, 3.2)]),  # the oracle: 20 tok/s
        run("specgate", [outcome("code", "draft", 6.4)]),
        run("adaptive", [outcome("code", "ngram", 3.25)]),
    ]
    warm = [
        Outcome("code", "w", 0.1, 4.0, 64, 64, "plain"),
        Outcome("code", "w", 0.1, 3.2, 64, 64, "ngram"),
    ]
    [row] = adaptive_bench.checks(speedup_report.aggregate(runs), runs, warm)
    assert row["oracle"] == "ngram" and row["oracle_tok_s"] == 20.0
    assert row["within_3pct_of_oracle"] and row["at_least_static"]
    assert row["warmup_requests"] == 2 and row["off_oracle_requests"] == 1  # the plain one
    assert abs(row["off_oracle_extra_s"] - 0.8) < 1e-9  # 4.0 s instead of 64 / 20
    assert "| code |" in adaptive_bench.markdown([row], warm)
