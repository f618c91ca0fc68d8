"""How well a learnt speed ranks backends: the geometric mean of requests' speeds against
output tokens over seconds, on bench.speedup's answers of each backend alone.

The truth per (concurrency, task) cell is the benchmark's own figure, ``sum(tokens) /
sum(e2e)`` over every answer of the backend (:func:`bench.speedup_report.summarize`). Each
estimator reads only the answers the learner learns from (``min_tokens`` or more, as
:class:`gateway.learning.observer.FeedbackCollector`, its default from
:class:`contracts.config.AdaptiveSettings`):

- ``geometric``: exp of the mean ln(tokens/s) of the answers (specgate before session 42);
- ``ratio``: their tokens over their seconds
  (:attr:`gateway.routing.adaptive.BackendStats.log_speed`).

Per cell it says whether each estimator, given every answer, ranks the fastest backend first,
and how often it does from ``k`` answers a backend drawn at random (seeded), with the chosen
backend's true speed as a share of the fastest's. Runs of several folders are pooled per cell
within a folder's runs (one machine), never across folders.

Usage::

    python -m bench.speed_estimators RUN_DIR [RUN_DIR ...] [--tasks rag] [--k 1,2,3,6]

where each RUN_DIR holds ``r*/speedup/results.json`` (a GPU twin run's repeats) or is such a
``results.json``'s folder. Prints a table; exits 0.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.speedup_report import summarize
from contracts.config import AdaptiveSettings

BACKENDS = ("plain", "ngram", "eagle3")

Answer = tuple[int, float]  # (output tokens, e2e seconds)


def load(folder: Path) -> dict[tuple[int, str, str], list[dict[str, Any]]]:
    """(concurrency, task, backend) -> the outcomes of the backend alone, from the
    ``results.json`` files under ``folder``."""
    cells: dict[tuple[int, str, str], list[dict[str, Any]]] = defaultdict(list)
    for path in sorted(folder.glob("**/results.json")):
        for run in json.loads(path.read_text())["runs"]:
            if run["target"] in BACKENDS:
                for o in run["outcomes"]:
                    cells[run["concurrency"], o["task"], run["target"]].append(o)
    return cells


def learnt(outcomes: list[dict[str, Any]], min_tokens: int) -> list[Answer]:
    """The answers the learner learns from: successful, ``min_tokens`` or more."""
    return [
        (o["output_tokens"], o["e2e_s"])
        for o in outcomes
        if not o["error"] and o["e2e_s"] and o["output_tokens"] >= min_tokens
    ]


def geometric(answers: list[Answer]) -> float:
    """exp(mean ln(tokens / seconds)), tokens/s."""
    return math.exp(sum(math.log(n / s) for n, s in answers) / len(answers))


def ratio(answers: list[Answer]) -> float:
    """sum(tokens) / sum(seconds), tokens/s."""
    return sum(n for n, _ in answers) / sum(s for _, s in answers)


ESTIMATORS = {"geometric": geometric, "ratio": ratio}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--tasks", default="code,rag,chat,creative")
    parser.add_argument("--k", default="1,2,3,6", help="answers a backend in each draw")
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    tasks, ks = args.tasks.split(","), [int(k) for k in args.k.split(",")]
    rng = random.Random(args.seed)
    names = list(ESTIMATORS)
    min_tokens = AdaptiveSettings().min_tokens
    print("| run | c | task | truth (tokens/s) | " + " | ".join(
        [f"{n}: fastest" for n in names]
        + [f"{n}, k={k}: right / share" for k in ks for n in names]
    ) + " |")  # fmt: skip
    print("|---" * (4 + len(names) * (1 + len(ks))) + "|")
    for folder in args.folders:
        cells = load(folder)
        for c in sorted({key[0] for key in cells}):
            for task in tasks:
                every = {b: cells.get((c, task, b), []) for b in BACKENDS}
                answers = {b: learnt(v, min_tokens) for b, v in every.items()}
                if not all(answers.values()):
                    continue
                truth = {b: summarize(v)["tok_s"] for b, v in every.items()}
                best = max(truth, key=truth.__getitem__)
                row = [
                    folder.name,
                    str(c),
                    task,
                    " / ".join(f"{b} {truth[b]:.0f}" for b in BACKENDS),
                ]
                for f in ESTIMATORS.values():
                    pick = max(BACKENDS, key=lambda b, f=f: f(answers[b]))  # type: ignore[misc]
                    row.append("yes" if pick == best else f"no ({pick})")
                for k in ks:
                    right = dict.fromkeys(names, 0)
                    share = dict.fromkeys(names, 0.0)
                    for _ in range(args.draws):
                        draw = {b: rng.sample(v, min(k, len(v))) for b, v in answers.items()}
                        for name, f in ESTIMATORS.items():
                            pick = max(BACKENDS, key=lambda b, f=f: f(draw[b]))  # type: ignore[misc]
                            right[name] += pick == best
                            share[name] += truth[pick] / truth[best]
                    row += [
                        f"{100 * right[n] / args.draws:.0f}% / {share[n] / args.draws:.3f}"
                        for n in names
                    ]
                print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
