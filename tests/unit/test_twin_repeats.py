"""bench.twin_repeats: medians over repeats, ratios taken within each repeat; bench.speedup's
extra gateways and relays."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from bench.speedup import _named_url, _relay_url
from bench.speedup_report import checks
from bench.twin_repeats import load, table

TASKS = ("code", "rag", "chat", "creative", "all")


def _repeat(folder: Path, speeds: dict[str, float]) -> Path:
    rows = [
        {"concurrency": 1, "task": task, "target": target, "tok_s": tok_s}
        for task in TASKS
        for target, tok_s in speeds.items()
    ]
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps({"rows": rows}))
    return folder


def test_medians_and_the_spread_of_the_ratios(tmp_path: Path) -> None:
    base = {"plain": 100.0, "ngram": 50.0, "eagle3": 150.0, "specgate": 120.0}
    repeats = [
        load(_repeat(tmp_path / f"r{i}", {**base, "adaptive": adaptive}))
        for i, adaptive in enumerate((150.0, 120.0, 90.0))
    ]
    lines = table(repeats)
    assert lines[0].startswith("| c | task | plain | ngram | eagle3 | specgate | adaptive |")
    code = next(line for line in lines if line.startswith("| 1 | code |"))
    # median adaptive 120; oracle eagle3; 120/150 = 0.80 (0.60-1.00); vs plain 1.20 (0.90-1.50)
    assert code == (
        "| 1 | code | 100 | 50 | 150 | 120 | 120 | eagle3 | 0.80 (0.60-1.00) | 1.20 (0.90-1.50) |"
    )


def test_a_variant_gateways_ratios(tmp_path: Path) -> None:
    """An ``--extra-gateway`` variant is a column, not an oracle candidate, and ``adaptive``
    names the gateway the ratios are of."""
    speeds = {"plain": 100.0, "eagle3": 150.0, "specgate": 120.0, "adaptive": 90.0}
    repeats = [load(_repeat(tmp_path / "r0", {**speeds, "adaptive-b": 300.0}))]
    code = next(line for line in table(repeats, "adaptive-b") if line.startswith("| 1 | code |"))
    assert code == (
        "| 1 | code | 100 | 150 | 120 | 90 | 300 | eagle3 | 2.00 (2.00-2.00) | 3.00 (3.00-3.00) |"
    )


@pytest.mark.parametrize(
    "spec", ["adaptive-b", "adaptive-b=", "plain=http://x", "adaptive=http://x"]
)
def test_an_extra_gateway_needs_an_adaptive_name_and_a_url(spec: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected adaptive-NAME=URL"):
        _named_url(spec)


def test_an_extra_gateway_spec() -> None:
    assert _named_url("adaptive-b=http://127.0.0.1:8030") == ("adaptive-b", "http://127.0.0.1:8030")


def test_a_relay_is_a_column_never_the_oracle(tmp_path: Path) -> None:
    """A ``--relay`` target (relay-NAME) is measured beside the gateways: a column of the
    table, never the oracle, and in bench.speedup_report's checks never the best backend."""
    name, url = _relay_url("bare=http://127.0.0.1:8040")
    assert (name, url) == ("relay-bare", "http://127.0.0.1:8040")
    speeds = {"plain": 100.0, "eagle3": 150.0, "specgate": 120.0, "adaptive": 90.0, name: 400.0}
    repeats = [load(_repeat(tmp_path / "r0", speeds))]
    lines = table(repeats)
    assert lines[0].startswith("| c | task | plain | eagle3 | specgate | adaptive | relay-bare |")
    code = next(line for line in lines if line.startswith("| 1 | code |"))
    assert code == (
        "| 1 | code | 100 | 150 | 120 | 90 | 400 | eagle3 | 0.60 (0.60-0.60) | 0.90 (0.90-0.90) |"
    )
    rows = [
        {"concurrency": 1, "task": "code", "target": t, "tok_s_p50": v} for t, v in speeds.items()
    ]
    (check,) = checks(rows)
    assert (check["best"], check["ratio_to_best"]) == ("eagle3", 120.0 / 150.0)


@pytest.mark.parametrize("spec", ["bare", "bare=", "=http://x"])
def test_a_relay_needs_a_name_and_a_url(spec: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected NAME=URL"):
        _relay_url(spec)


def test_every_single_backend_is_an_oracle_candidate(tmp_path: Path) -> None:
    """A single backend outside the twin's three (a draft-model server) is a column and an
    oracle candidate, after plain, ngram and eagle3."""
    speeds = {"draft": 200.0, "plain": 100.0, "eagle3": 150.0, "specgate": 120.0, "adaptive": 90.0}
    lines = table([load(_repeat(tmp_path / "r0", speeds))])
    assert lines[0].startswith("| c | task | plain | eagle3 | draft | specgate | adaptive |")
    code = next(line for line in lines if line.startswith("| 1 | code |"))
    assert code == (
        "| 1 | code | 100 | 150 | 200 | 120 | 90 | draft | 0.45 (0.45-0.45) | 0.90 (0.90-0.90) |"
    )
