"""bench.decision_bursts: the load each decision read, by burst, from a decision log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.decision_bursts import bursts, decisions, main, summary


def line(when: str, backend: str, concurrency: float) -> str:
    decision = {"request_id": "r", "concurrency": concurrency, "backend": backend}
    return f"2026-12-05 {when} DEBUG specgate.decision: {json.dumps(decision)}\n"


LOG = [
    "2026-12-05 15:25:33,000 INFO specgate.access: request_id=r status=200\n",
    line("15:25:33,100", "eagle3", 1.0),  # alone
    line("15:25:34,100", "plain", 2.0),  # alone, but read another client's request
    line("15:25:35,100", "plain", 7.0),  # a wave of 4 that read 3 more than itself
    line("15:25:35,101", "plain", 7.0),
    line("15:25:35,103", "plain", 7.0),
    line("15:25:35,104", "plain", 7.0),
    line("15:25:36,100", "eagle3", 4.0),  # a wave of 4 at its own load
    line("15:25:36,110", "eagle3", 4.0),
    line("15:25:36,120", "eagle3", 4.0),
    line("15:25:36,130", "eagle3", 4.0),
]


def test_bursts_and_the_load_their_first_request_read() -> None:
    rows = decisions(LOG)
    assert len(rows) == 10 and rows[0][0] == pytest.approx(1796484333.1)
    groups = bursts(rows, gap_s=0.03)
    assert [len(g) for g in groups] == [1, 1, 4, 4]
    by_size = summary(groups)
    assert (by_size[1].bursts, by_size[1].over) == (2, 1)
    assert (by_size[4].bursts, by_size[4].over) == (2, 1)
    assert by_size[4].first_to == {"plain": 1, "eagle3": 1}


def test_a_window_keeps_one_repeat(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "up.log"
    log.write_text("".join(LOG))
    assert main([str(log), "--since", "1796484335", "--until", "1796484336"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[2:] == ["| 4 | 1 | 1 | plain 1 |"]
