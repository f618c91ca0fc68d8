"""Derive a simulator profile from a ``bench.speedup`` results.json of a GPU run.

    python -m bench.sim.derive RESULTS.json [RESULTS.json ...] > bench/sim/twin-2026-12-01.json

Several files (repeats of one run on one stack, e.g. ``r1/speedup/results.json
r2/speedup/results.json r3/speedup/results.json``) are pooled: each cell's outcomes of all
of them together, total tokens over total time; the prompts and meta are the first file's.

Reads each backend alone (``plain``, ``ngram``, ``eagle3``) per concurrency and task and
writes small derived numbers only: output tokens/s per request per cell (the calibration
target), each prompt's output length (plain, c=1), and a first fit of the cost model:

* decode step time by batch: decode time per SSE chunk (``(e2e - ttft) / (chunks - 1)``)
  over the cell's requests (on plain divided by tokens per chunk: detokenization merges some
  tokens into one chunk, 1.00-1.12 tokens a chunk), mean over tasks, at batch = concurrency;
* tokens per step by task: tokens per chunk over plain's of the same task (the merging),
  mean over concurrencies; EAGLE-3 drafts every step, so its conditional acceptance p
  solves ``1 + p + ... + p^k = tokens``;
  ngram drafts only when the prompt matches: p from the acceptance per drafted token that
  ../shared/notes/gpu-costtwin.md measured per task on the twin (code 0.57, rag 0.51,
  chat 0.22, creative 0.12), the share of drafting steps from the tokens per step;
* admission cost per request: the rise of chat's TTFT p50 from c=1 to c=64, over 32 (the
  median request of a wave waits for half of it to be admitted before it); fixed
  latency: chat's TTFT p50 at c=1 less that, one step and the prefill of its prompt.
  ``bench.sim_calibrate --fit`` then scales each step-time point until the simulated
  tokens/s of each backend alone match the measured ones.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

KINDS = {"plain": ("none", 0), "ngram": ("ngram", 4), "eagle3": ("eagle3", 3)}
TASKS = ("code", "rag", "chat", "creative")
#: ngram acceptance per drafted token by task on the twin (../shared/notes/gpu-costtwin.md).
NGRAM_RATE = {"code": 0.57, "rag": 0.51, "chat": 0.22, "creative": 0.12}
#: Self-draft acceptance by temperature on the twin, relative to greedy (same notes).
#: Prefill GPU time per prompt token: rag prompts (~750 tokens) had a TTFT 19 ms above chat's
#: (~55 tokens) at c=1 on plain (twin run).
PREFILL_MS_PER_TOKEN = 0.025
TEMPERATURE_CURVE = [[0.0, 1.0], [0.7, 0.41], [1.0, 0.133], [2.0, 0.05]]


def solve_p(accepted: float, k: int) -> float:
    """The p in [0, 0.99] with ``p + p^2 + ... + p^k = accepted`` (bisection)."""
    lo, hi = 0.0, 0.99
    for _ in range(50):
        mid = (lo + hi) / 2
        if sum(mid**i for i in range(1, k + 1)) < accepted:
            lo = mid
        else:
            hi = mid
    return round(lo, 4)


def cells(results: dict[str, Any]) -> dict[tuple[str, int, str], list[dict[str, Any]]]:
    """Outcomes by (target, concurrency, task)."""
    out: dict[tuple[str, int, str], list[dict[str, Any]]] = defaultdict(list)
    for run in results["runs"]:
        for o in run["outcomes"]:
            if not o.get("error"):
                out[(run["target"], run["concurrency"], o["task"])].append(o)
    return out


def streamed(outcomes: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The outcomes that streamed some text (a first token time): a sampled request may end
    at its first token with no text (one token, EOS; the twentieth GPU run had one, creative
    on plain at c=32), which counts in tokens/s but has no step or first token to time."""
    return [o for o in outcomes if o["ttft_s"] is not None]


def derive(results: dict[str, Any]) -> dict[str, Any]:
    """The profile document (see the module docstring)."""
    by = cells(results)
    concurrencies = sorted({c for (_t, c, _k) in by})
    temperatures = {i["task"]: i["temperature"] for i in results["meta"]["items"]}

    def tok_s(os: Sequence[dict[str, Any]]) -> float:
        return float(sum(o["output_tokens"] for o in os) / sum(o["e2e_s"] for o in os))

    def per_chunk(os: Sequence[dict[str, Any]]) -> tuple[float, float]:
        os = streamed(os)
        steps = sum(o["chunks"] - 1 for o in os)
        decode = sum(o["e2e_s"] - o["ttft_s"] for o in os)
        return sum(o["output_tokens"] - 1 for o in os) / steps, 1000 * decode / steps

    measured: dict[str, dict[str, dict[str, float]]] = {}
    kinds: dict[str, Any] = {}
    for kind, (method, k) in KINDS.items():
        measured[kind] = {
            str(c): {t: round(tok_s(by[(kind, c, t)]), 1) for t in TASKS} for c in concurrencies
        }
        steps, tokens = [], defaultdict(list)
        for c in concurrencies:
            ms = []
            for t in TASKS:
                tpc, step = per_chunk(by[(kind, c, t)])
                plain_tpc = per_chunk(by[("plain", c, t)])[0]
                ms.append(step / tpc if kind == "plain" else step)
                tokens[t].append(tpc / plain_tpc)
            steps.append([c, round(statistics.mean(ms), 3)])
        chat = [by[(kind, c, "chat")] for c in concurrencies]
        ttft = [statistics.median(o["ttft_s"] for o in streamed(os)) for os in chat]
        admit = 1000 * (ttft[-1] - ttft[0]) / (concurrencies[-1] / 2)  # the median waits c/2
        chat_tokens = statistics.mean(
            i["prompt_chars"] / 4 for i in results["meta"]["items"] if i["task"] == "chat"
        )
        entry: dict[str, Any] = {
            "method": method,
            "k": k,
            "step_ms": steps,
            "observed_step_ms": steps,
            "latency_ms": round(
                1000 * ttft[0] - admit - steps[0][1] - PREFILL_MS_PER_TOKEN * chat_tokens, 2
            ),
            "admit_ms": round(admit, 3),
            "prefill_ms_per_token": PREFILL_MS_PER_TOKEN,
        }
        if k:
            mean_tokens = {t: statistics.mean(v) for t, v in tokens.items()}
            if method == "ngram":
                accept = {t: solve_p(NGRAM_RATE[t] * k, k) for t in TASKS}
                share = {
                    t: round(min(1.0, (mean_tokens[t] - 1) / (NGRAM_RATE[t] * k)), 4) for t in TASKS
                }
            else:
                accept = {t: solve_p(max(mean_tokens[t] - 1, 0.0), k) for t in TASKS}
                share = dict.fromkeys(TASKS, 1.0)
            entry |= {"draft_share": share, "accept": accept}
        kinds[kind] = entry
    lengths = {
        o["id"]: o["output_tokens"]
        for c in concurrencies[:1]
        for t in TASKS
        for o in by[("plain", c, t)]
    }
    return {
        "source": results["meta"].get("date", "") + " " + results["meta"].get("config", ""),
        "per_task": int(results["meta"].get("per_task", 16)),
        "temperatures": temperatures,
        "temperature_curve": TEMPERATURE_CURVE,
        "kinds": kinds,
        "lengths": lengths,
        "measured": measured,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Print the profile derived from the results file named in ``argv``."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args:
        print(__doc__.splitlines()[2].strip(), file=sys.stderr)
        return 2
    print(json.dumps(derive(pooled([json.loads(Path(a).read_text()) for a in args])), indent=1))
    return 0


def pooled(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One results document from the repeats ``results`` (at least one): the first's meta,
    every one's runs (so each cell's outcomes are pooled, total over total), nothing else
    (the per-repeat tables no longer apply); with more than one, the meta's ``date`` names
    how many were pooled."""
    first = results[0]
    if len(results) == 1:
        return first
    meta = first["meta"] | {"date": f"{first['meta'].get('date', '')} ({len(results)} pooled)"}
    return {"meta": meta, "runs": [r for doc in results for r in doc["runs"]]}


if __name__ == "__main__":
    sys.exit(main())
