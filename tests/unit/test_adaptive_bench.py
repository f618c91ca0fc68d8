"""The adaptive section of bench.speedup on synthetic outcomes: the oracle per task, the
targets, and the exploration cost (logic only; timings are never asserted)."""

from __future__ import annotations

from typing import Any

from bench import adaptive_bench
from bench.llm_client import Outcome


def outcome(item: str, backend: str | None, decode_s: float) -> Outcome:
    """65 tokens: the first after 0.5 s, the other 64 over ``decode_s`` seconds."""
    return Outcome("code", item, 0.5, 0.5 + decode_s, 65, 65, backend)


def run(target: str, outs: list[Outcome]) -> dict[str, Any]:
    return {
        "target": target,
        "concurrency": 1,
        "wall_s": 1.0,
        "acceptance": {},
        "outcomes": [o.to_json() for o in outs],
    }


def test_checks_against_static_and_the_oracle() -> None:
    runs = [
        run("plain", [outcome("a", None, 4.0), outcome("b", None, 4.0)]),
        run("ngram", [outcome("a", None, 3.2), outcome("b", None, 3.2)]),  # oracle: 20 tok/s
        run("specgate", [outcome("a", "draft", 6.4), outcome("b", "ngram", 3.2)]),
        run("adaptive", [outcome("a", "ngram", 3.2), outcome("b", "ngram", 3.2)]),
    ]
    warm = [outcome("w1", "plain", 4.0), outcome("w2", "ngram", 3.2)]
    [row] = adaptive_bench.checks(runs, warm)
    assert row["oracle"] == "ngram" and row["decode_tok_s"]["ngram"] == 20.0
    assert row["within_3pct_of_oracle"] and row["at_least_static"]
    assert row["on_oracle"] == {"adaptive": "2/2", "specgate": "1/2"}
    assert row["warmup_requests"] == 2 and row["off_oracle_requests"] == 1  # the plain one
    assert abs(row["off_oracle_extra_s"] - 0.8) < 1e-9  # 4.0 s instead of 64 / 20
    assert not row["same_routing_as_static"]
    assert "| code | ngram |" in adaptive_bench.markdown([row], warm)
