"""The classifier benchmark's data: the development prompts (``shared/datasets/prompts``),
the request bodies a client would send for them, and their classifier inputs. Shared by
``bench.classify`` (scores) and ``bench.classify_fit`` (the fit).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gateway.classify.signals import read_signals
from gateway.classify.text import read_request

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "prompts"
Item = tuple[str, str, dict[str, Any]]  # (id, task, request body)
Shaped = tuple[str, str, str, dict[str, Any]]  # (id, task, shape, request body)
Sample = tuple[dict[str, float], frozenset[str]]


def load_rows(data: Path) -> list[dict[str, Any]]:
    """All JSON lines of ``data/*.jsonl`` (each with ``task`` and ``prompt``)."""
    rows: list[dict[str, Any]] = []
    for path in sorted(data.glob("*.jsonl")):
        with path.open(encoding="utf-8") as f:
            rows.extend(json.loads(line) for line in f if line.strip())
    return rows


def to_body(row: Mapping[str, Any], *, turns: bool = False) -> dict[str, Any]:
    """The request body a client would send for a dataset row.

    HumanEval stubs become a completions ``prompt``, anything else a chat user message. With
    ``turns``, a multi-turn item becomes its user turns separated by (empty) assistant turns.
    """
    if row.get("prompt_format") == "completion":
        return {"model": "m", "prompt": row["prompt"], "max_tokens": 256}
    messages: list[dict[str, str]] = []
    for i, turn in enumerate((row.get("turns") if turns else None) or [row["prompt"]]):
        if i:
            messages.append({"role": "assistant", "content": ""})
        messages.append({"role": "user", "content": turn})
    return {"model": "m", "messages": messages}


def to_items(rows: Iterable[Mapping[str, Any]]) -> list[Item]:
    """(id, task, body) for every row."""
    return [(str(r["id"]), str(r["task"]), to_body(r)) for r in rows]


def samples_of(items: Sequence[Shaped]) -> list[Sample]:
    """(named features, instruction-window words) of every shaped item's body."""
    out: list[Sample] = []
    for _, _, _, body in items:
        rt = read_request(body)
        out.append(read_signals(rt) if rt is not None else ({}, frozenset()))
    return out
