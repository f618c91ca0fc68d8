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
        run("ngram", [outcome("a", None, 3.0), outcome("b", None, 3.0)]),  # the oracle
        run("draft", [outcome("a", None, 8.0), outcome("b", None, 8.0)]),
        run("specgate", [outcome("a", "draft", 8.5), outcome("b", "ngram", 3.1)]),
        run("adaptive", [outcome("a", "ngram", 3.2), outcome("b", "plain", 4.1)]),
    ]
    warm = [outcome("w1", "plain", 4.0), outcome("w2", "ngram", 3.0)]
    [row] = adaptive_bench.checks(runs, warm)
    assert row["oracle"] == "ngram"
    assert row["routed"] == {
        "adaptive": {"ngram": 1, "plain": 1},
        "specgate": {"draft": 1, "ngram": 1},
    }
    # replayed: adaptive's choices cost 3.5 + 4.5 s, static's 8.5 + 3.5 s, the oracle's 7 s
    assert row["replayed_tok_s"] == {
        "adaptive": 130 / 8.0,
        "specgate": 130 / 12.0,
        "ngram": 130 / 7.0,
    }
    assert not row["within_3pct_of_oracle"] and row["at_least_static"]
    assert row["off_oracle_requests"] == 2  # the plain warm-up one and the measured plain one
    assert abs(row["off_oracle_extra_s"] - (4.5 - 65 * 7 / 130 + 1.0)) < 1e-9
    assert "| code | ngram |" in adaptive_bench.markdown([row], warm)


def test_relays_and_variants_are_never_the_oracle() -> None:
    """A ``--relay`` in front of plain and an ``--extra-gateway`` variant can be faster than
    every backend alone in a run (the ninth GPU run's raw report named relay-vllm-router the
    oracle for creative); the oracle is still the best single backend."""
    runs = [
        run("plain", [outcome("a", None, 4.0), outcome("b", None, 4.0)]),
        run("ngram", [outcome("a", None, 3.0), outcome("b", None, 3.0)]),  # the oracle
        run("specgate", [outcome("a", "ngram", 3.1), outcome("b", "ngram", 3.1)]),
        run("adaptive", [outcome("a", "ngram", 3.2), outcome("b", "plain", 4.1)]),
        run("adaptive-b", [outcome("a", "ngram", 2.0), outcome("b", "ngram", 2.0)]),
        run("relay-bare", [outcome("a", None, 1.0), outcome("b", None, 1.0)]),
    ]
    [row] = adaptive_bench.checks(runs, [])
    assert row["oracle"] == "ngram"


def test_failed_requests_are_counted_and_reported_never_fatal() -> None:
    """bench.speedup once crashed in its report (None < str) after requests had failed."""
    from bench import speedup_report

    failed = Outcome("code", "b", None, None, 0, 0, None, "HTTP 500: backend died")
    runs = [
        run("plain", [outcome("a", None, 4.0), outcome("b", None, 4.0)]),
        run("ngram", [outcome("a", None, 3.0), outcome("b", None, 3.0)]),
        run("specgate", [outcome("a", "ngram", 3.1), failed]),
        run("adaptive", [outcome("a", "ngram", 3.2), failed]),
    ]
    [row] = adaptive_bench.checks(runs, [failed])
    assert row["routed"]["adaptive"] == {"ngram": 1}
    assert row["failed"]["adaptive"] == 1 and row["failed"]["plain"] == 0
    assert "ngram 1, failed 1" in adaptive_bench.markdown([row], [failed])
    rows = speedup_report.aggregate(runs)
    gate = next(r for r in rows if r["target"] == "specgate" and r["task"] == "all")
    assert gate["errors"] == 1 and gate["routed"] == {"ngram": 1}
    meta = {"date": "d", "machine": "m", "config": "c", "per_task": 2, "max_tokens": 64}
    meta |= {"max_prompt_chars": 3000, "elapsed_s": 60.0}
    text = speedup_report.markdown(rows, runs, meta)
    assert "- c1 specgate: 1 of 2 failed: 1x HTTP 500: backend died" in text


def test_the_header_names_servers_without_prefix_caching() -> None:
    """A run whose servers had no prefix cache (``--no-prefix-cache``, stack.sh's
    NO_PREFIX_CACHE) says so where its dealing is named; one with the cache says nothing."""
    from bench import speedup_report

    runs = [run("plain", [outcome("a", None, 4.0)])]
    rows = speedup_report.aggregate(runs)
    meta = {"date": "d", "machine": "m", "config": "c", "per_task": 1, "max_tokens": 64}
    meta |= {"max_prompt_chars": 3000, "elapsed_s": 60.0, "waves": "per-task"}
    cached = speedup_report.markdown(rows, runs, meta | {"prefix_cache": True})
    off = speedup_report.markdown(rows, runs, meta | {"prefix_cache": False})
    assert "per-task waves; took 1.0 min" in cached
    assert "per-task waves; servers without prefix caching; took 1.0 min" in off
