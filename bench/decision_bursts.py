"""``python -m bench.decision_bursts LOG [--since EPOCH_S] [--until EPOCH_S] [--gap-ms 30]``:
the load each routing decision read, by burst, from a gateway's decision log.

``LOG`` is a gateway's log with ``SPECGATE_LOG_LEVEL=debug`` (each routed request's
decision as a ``specgate.decision`` line: :data:`gateway.pipeline.decision_log`; e.g.
``scripts/gpu/stack.sh``'s ``up.log``, ``bench.sim_fleet``'s ``logs/gateway.log``). Decisions
less than ``--gap-ms`` apart form a burst (a bench's wave reaches the gateway within a few
milliseconds; its waves are at least ``settle_s``, 50 ms, apart). ``--since``/``--until``
(Unix seconds, UTC; e.g. ``scripts/gpu/twin-run.sh``'s ``t0``..``t1`` files) keep one
repeat's window. Prints, per burst size, the bursts, the backends their first request went
to, and how many of those first requests read more load than the burst itself (a
decision's ``concurrency`` over the burst's size: load the gateway did not send, such as
another client's requests counted by a ``/metrics`` scrape; docs/benchmarks.md section 7,
thirteenth run). The log's times are the gateway host's local time, read as UTC.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

MARK = "specgate.decision: "


def decisions(lines: Iterable[str]) -> list[tuple[float, dict[str, Any]]]:
    """``(epoch seconds, decision)`` of every decision line in ``lines``, in order; a line
    starts with the logging module's ``%Y-%m-%d %H:%M:%S,mmm`` time."""
    out = []
    for line in lines:
        if MARK not in line:
            continue
        when = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=UTC)
        out.append((when.timestamp(), json.loads(line.split(MARK, 1)[1])))
    return out


def bursts(
    rows: Sequence[tuple[float, dict[str, Any]]], gap_s: float
) -> list[list[dict[str, Any]]]:
    """``rows`` (in time order) split where two decisions are more than ``gap_s`` apart."""
    out: list[list[dict[str, Any]]] = []
    last = None
    for when, decision in rows:
        if last is None or when - last > gap_s:
            out.append([])
        out[-1].append(decision)
        last = when
    return out


@dataclass
class BySize:
    """The bursts of one size: how many, their first requests' backends, and how many of
    those read more load than the burst (``over``)."""

    bursts: int = 0
    over: int = 0
    first_to: Counter[str] = field(default_factory=Counter)


def summary(groups: Iterable[list[dict[str, Any]]]) -> dict[int, BySize]:
    """Per burst size (requests), a :class:`BySize`."""
    out: dict[int, BySize] = {}
    for group in groups:
        first, size = group[0], len(group)
        entry = out.setdefault(size, BySize())
        entry.bursts += 1
        entry.over += float(first.get("concurrency", 0)) > size
        entry.first_to[str(first.get("backend"))] += 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry (see the module doc); exit code 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--since", type=float, default=float("-inf"))
    parser.add_argument("--until", type=float, default=float("inf"))
    parser.add_argument("--gap-ms", type=float, default=30.0)
    args = parser.parse_args(argv)
    with args.log.open(encoding="utf-8", errors="replace") as lines:
        rows = [r for r in decisions(lines) if args.since <= r[0] < args.until]
    print("| burst size | bursts | first read more load than the burst | first routed to |")
    print("|---|---|---|---|")
    for size, entry in sorted(summary(bursts(rows, args.gap_ms / 1000)).items()):
        routed = ", ".join(f"{b} {n}" for b, n in entry.first_to.most_common())
        print(f"| {size} | {entry.bursts} | {entry.over} | {routed} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
