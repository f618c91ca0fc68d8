"""``python -m bench.speedup --adaptive``: adaptive routing beside static rules and each
backend alone.

A second gateway runs the same config with ``routing.policy: adaptive``. Before the measured
runs it is warmed up, one request at a time, on ``--warmup`` prompts per task taken from the
same datasets but outside the measured sample (only for tasks where its rules leave it a
choice, as ``/routes/explain`` shows). It is then measured on the same items as every other
target (the ``adaptive`` target) and keeps learning meanwhile.

Targets (issue #7): per task, adaptive at least as fast as static rules (``specgate``) and
within 3% of the best single backend (the oracle). The exploration cost is counted as the
requests, warm-up and measured, the adaptive gateway sent to a backend other than the
task's oracle, and the seconds they took beyond the oracle's mean time per token.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench import speedup_report
from bench.llm_client import Outcome, run_items
from bench.procs import Server, free_port
from bench.workloads import TASKS, Item, sample

TARGET = "adaptive"
STATIC = "specgate"
#: Within this share of the oracle's tokens/s per task.
WITHIN_ORACLE = 0.97


@contextlib.contextmanager
def context(args: argparse.Namespace, work: Path) -> Iterator[str | None]:
    """The adaptive gateway's URL for ``bench.speedup``'s arguments (None without
    ``--adaptive``): ``--adaptive-gateway`` when given, else one started here on the
    launched config (``--launch``, entered after it) or on ``--config``."""
    if not args.adaptive:
        yield None
    elif args.adaptive_gateway:
        yield args.adaptive_gateway
    else:
        launched = work / "speedup-config.yaml"
        config = launched if args.launch else args.config
        with adaptive_gateway(config, work, args.out / "logs") as url:
            yield url


@contextlib.contextmanager
def adaptive_gateway(config_path: Path, work: Path, logs: Path) -> Iterator[str]:
    """Serve the config at ``config_path`` with ``routing.policy: adaptive`` from a
    subprocess on a free port; yields its URL."""
    data = copy.deepcopy(yaml.safe_load(config_path.read_text()))
    data.setdefault("routing", {})["policy"] = TARGET
    path = work / "adaptive-config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    port = free_port()
    argv = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path)]
    server = Server(
        TARGET,
        [*argv, "--port", str(port)],
        ready_url=f"http://127.0.0.1:{port}/ready",
        log_path=logs / "adaptive-gateway.log",
    )
    with server:
        yield f"http://127.0.0.1:{port}"


def has_choice(url: str, model: str, item: Item) -> bool:
    """True when the adaptive gateway's rules leave more than one backend for ``item``."""
    body = item.request(model, 8)
    out = httpx.post(f"{url}/routes/explain", json=body, timeout=30).json()
    adaptive = out.get("adaptive")
    return bool(adaptive) and len(adaptive["estimates"]) > 1


def warmup_items(
    data: Path, measured: Sequence[Item], per_task: int, warmup: int, max_prompt_chars: int
) -> list[Item]:
    """Up to ``2 * warmup`` candidate items per task from the datasets, none in ``measured``
    (:func:`warm_up` sends at most ``warmup`` of them per task)."""
    taken = {i.id for i in measured}
    more = sample(data, per_task + 2 * warmup, max_prompt_chars)
    pool = [i for i in more if i.id not in taken]
    return [item for t in TASKS for item in [i for i in pool if i.task == t][: 2 * warmup]]


def warm_up(
    url: str, model: str, items: Sequence[Item], warmup: int, max_tokens: int, log: Any = print
) -> list[Outcome]:
    """Warm the adaptive gateway up, one request at a time, with at most ``warmup``
    requests per task, each one the gateway's rules leave a choice for."""
    todo = []
    for task in TASKS:
        mine = [i for i in items if i.task == task and has_choice(url, model, i)]
        todo += mine[:warmup]
    tasks = ", ".join(f"{t} {sum(1 for i in todo if i.task == t)}" for t in TASKS)
    log(f"bench: adaptive warm-up, {len(todo)} requests ({tasks})")
    outcomes, _ = run_items(url, model, todo, concurrency=1, max_tokens=max_tokens)
    return outcomes


def _tok_s(outs: Sequence[dict[str, Any]]) -> float | None:
    ok = [o for o in outs if not o["error"] and o["e2e_s"]]
    seconds = sum(o["e2e_s"] for o in ok)
    return sum(o["output_tokens"] for o in ok) / seconds if seconds else None


def medians(runs: Sequence[dict[str, Any]]) -> dict[tuple[str, str], float]:
    """Median per-request tokens/s (tokens / end-to-end s) per (target, task) at
    concurrency 1: robust to the few requests a busy shared machine stalls."""
    per: dict[tuple[str, str], list[float]] = {}
    for run in runs:
        if run["concurrency"] != 1:
            continue
        for o in run["outcomes"]:
            if not o["error"] and o["e2e_s"]:
                per.setdefault((run["target"], o["task"]), []).append(
                    o["output_tokens"] / o["e2e_s"]
                )
    return {key: statistics.median(values) for key, values in per.items()}


def checks(
    rows: Sequence[dict[str, Any]],
    runs: Sequence[dict[str, Any]],
    warm: Sequence[Outcome],
) -> list[dict[str, Any]]:
    """Per task at concurrency 1: adaptive vs static rules vs the oracle, and the
    exploration cost (off-oracle requests and their extra seconds)."""
    index = {(r["target"], r["task"]): r for r in rows if r["concurrency"] == 1}
    singles = sorted({t for t, _ in index if t not in (TARGET, STATIC)})
    measured = next((r for r in runs if r["target"] == TARGET and r["concurrency"] == 1), None)
    med = medians(runs)
    out = []
    for task in TASKS:
        cands = [index[(s, task)] for s in singles if (s, task) in index]
        cands = [c for c in cands if c["tok_s"]]
        mine, static = index.get((TARGET, task)), index.get((STATIC, task))
        if not cands or mine is None or not mine["tok_s"]:
            continue
        oracle = max(cands, key=lambda r: r["tok_s"])
        s_per_tok = 1.0 / oracle["tok_s"]
        served = [o.to_json() for o in warm if o.task == task]
        served += [o for o in (measured or {}).get("outcomes", []) if o["task"] == task]
        off = [o for o in served if o["backend"] and o["backend"] != oracle["target"]]
        extra = sum(max(0.0, (o["e2e_s"] or 0.0) - o["output_tokens"] * s_per_tok) for o in off)
        row = {
            "task": task,
            "adaptive_tok_s": mine["tok_s"],
            "static_tok_s": static["tok_s"] if static else None,
            "oracle": oracle["target"],
            "oracle_tok_s": oracle["tok_s"],
            "ratio_to_oracle": mine["tok_s"] / oracle["tok_s"],
            "warmup_requests": sum(1 for o in warm if o.task == task),
            "off_oracle_requests": len(off),
            "off_oracle_extra_s": extra,
            "routed": mine["routed"],
        }
        row["ratio_to_static"] = mine["tok_s"] / static["tok_s"] if static else None
        by_median = max(singles, key=lambda s: med.get((s, task), 0.0))
        row["median_tok_s"] = {t: med.get((t, task)) for t in (TARGET, STATIC, by_median)}
        row["median_oracle"] = by_median
        mine_m, best_m = med.get((TARGET, task)), med.get((by_median, task))
        row["median_ratio_to_oracle"] = mine_m / best_m if mine_m and best_m else None
        row["within_3pct_of_oracle"] = row["ratio_to_oracle"] >= WITHIN_ORACLE
        row["at_least_static"] = static is None or mine["tok_s"] >= static["tok_s"]
        out.append(row)
    return out


def markdown(results: Sequence[dict[str, Any]], warm: Sequence[Outcome]) -> str:
    """The adaptive section of ``speedup.md``."""
    lines = [
        "",
        "## Adaptive routing (issue #7), concurrency 1",
        "",
        "tok/s as above (sum of tokens / sum of end-to-end seconds); the medians column "
        "divides the medians of per-request tokens/s (robust to stalls of a shared machine).",
        "",
        f"Warm-up: {len(warm)} requests (tasks with a choice; prompts outside the sample), "
        f"warm-up tokens/s {_f(_tok_s([o.to_json() for o in warm]))}.",
        "",
        "| task | adaptive tok/s | static rules | oracle (best single) | vs oracle | vs static "
        "| medians: adaptive / oracle | warm-up | off-oracle requests | their extra s "
        "| adaptive routed to |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        routed = ", ".join(f"{k} {v}" for k, v in sorted(r["routed"].items()))
        lines.append(
            f"| {r['task']} | {_f(r['adaptive_tok_s'])} | {_f(r['static_tok_s'])} | "
            f"{r['oracle']} {_f(r['oracle_tok_s'])} | {r['ratio_to_oracle']:.3f} "
            f"({'met' if r['within_3pct_of_oracle'] else 'NOT met'}) | "
            f"{_f(r['ratio_to_static'], 3)} ({'met' if r['at_least_static'] else 'NOT met'}) | "
            f"{_f(r['median_ratio_to_oracle'], 3)} ({r['median_oracle']}) | "
            f"{r['warmup_requests']} | {r['off_oracle_requests']} | "
            f"{r['off_oracle_extra_s']:.1f} | {routed} |"
        )
    return "\n".join(lines) + "\n"


def report(out: Path, runs: Sequence[dict[str, Any]], warm: Sequence[Outcome]) -> None:
    """Add the adaptive section to ``speedup.md`` and ``adaptive`` to ``results.json``."""
    results = checks(speedup_report.aggregate(runs), runs, warm)
    with (out / "speedup.md").open("a") as f:
        f.write(markdown(results, warm))
    path = out / "results.json"
    data = json.loads(path.read_text())
    data["adaptive"] = {"checks": results, "warmup": [o.to_json() for o in warm]}
    path.write_text(json.dumps(data, indent=1))


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
