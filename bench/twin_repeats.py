"""``python -m bench.twin_repeats [--adaptive NAME] DIR [DIR ...]``: bench.speedup repeats,
median and spread.

Each ``DIR`` is one repeat's ``bench.speedup --out`` folder (its ``results.json``; e.g. the
GPU twin run's ``r1/speedup r2/speedup r3/speedup``, ``scripts/gpu/twin-run.sh``). Prints a
Markdown table per (concurrency, task): the median output tokens/s per request (sum of tokens
over sum of end-to-end seconds) of every target over the repeats, the oracle (the single
backend with the best median), and adaptive's ratio to the oracle and to plain as
``median (min-max)`` over the repeats, each ratio taken within one repeat (the oracle of that
repeat), so a busy host moves both sides (issue #25 item 3). ``--adaptive`` names the gateway
the ratios are of (default ``adaptive``, else ``specgate``; e.g. a variant measured with
``bench.speedup --extra-gateway adaptive-b=URL``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from bench.speedup_report import is_gateway

#: The column order of the single backends the twin runs name; any other single backend (a
#: draft-model server) follows them, by name. What is a single backend is
#: :func:`bench.speedup_report.is_gateway`'s to say, as everywhere else.
ORDER = ("plain", "ngram", "eagle3")
TASKS = ("code", "rag", "chat", "creative", "all")


def load(folder: Path) -> dict[tuple[int, str, str], float]:
    """``{(concurrency, task, target): tokens/s}`` of one repeat's ``results.json``."""
    rows = json.loads((folder / "results.json").read_text())["rows"]
    return {(r["concurrency"], r["task"], r["target"]): float(r["tok_s"]) for r in rows}


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def table(
    repeats: list[dict[tuple[int, str, str], float]], adaptive: str | None = None
) -> list[str]:
    """The Markdown lines (header first); raises KeyError when a repeat lacks a cell."""
    c0 = min(k[0] for k in repeats[0])
    found = {t for (c, task, t) in repeats[0] if c == c0 and task == "all" and not is_gateway(t)}
    singles = sorted(found, key=lambda s: (ORDER.index(s) if s in ORDER else len(ORDER), s))
    # bench.sim_fleet runs one gateway, adaptive, named "specgate"
    if adaptive is None:
        adaptive = "adaptive" if (c0, "all", "adaptive") in repeats[0] else "specgate"
    gateways = sorted(
        t for (c, task, t) in repeats[0] if c == c0 and task == "all" and is_gateway(t)
    )
    targets = [*singles, *dict.fromkeys(["specgate", *gateways, adaptive])]
    head = ["c", "task", *targets, "oracle", f"{adaptive} / oracle", f"{adaptive} / plain"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for c in sorted({k[0] for k in repeats[0]}):
        for task in TASKS:
            median = {t: statistics.median(r[(c, task, t)] for r in repeats) for t in targets}
            to_oracle = [
                r[(c, task, adaptive)] / max(r[(c, task, s)] for s in singles) for r in repeats
            ]
            to_plain = [r[(c, task, adaptive)] / r[(c, task, "plain")] for r in repeats]
            oracle = max(singles, key=lambda s: median[s])
            cells = " | ".join(f"{median[t]:.0f}" for t in targets)
            ratios = f"{_spread(to_oracle)} | {_spread(to_plain)}"
            lines.append(f"| {c} | {task} | {cells} | {oracle} | {ratios} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    """CLI entry (see the module doc); exit code 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adaptive", help="the gateway the ratios are of")
    parser.add_argument("folders", nargs="+", type=Path)
    args = parser.parse_args(argv)
    print("\n".join(table([load(f) for f in args.folders], args.adaptive)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
