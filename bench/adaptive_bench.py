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
    url: str,
    model: str,
    items: Sequence[Item],
    warmup: int,
    max_tokens: int,
    log: Any = print,
    prime: Sequence[str] = (),
) -> list[Outcome]:
    """Warm the adaptive gateway up, one request at a time, with at most ``warmup``
    requests per task, each one the gateway's rules leave a choice for. ``prime``: backend
    URLs sent one short request first, so their one-off first-request cost is not taken
    for a slow backend."""
    for backend in prime:
        run_items(backend, model, items[:1], concurrency=1, max_tokens=8)
    todo = []
    for task in TASKS:
        mine = [i for i in items if i.task == task and has_choice(url, model, i)]
        todo += mine[:warmup]
    tasks = ", ".join(f"{t} {sum(1 for i in todo if i.task == t)}" for t in TASKS)
    log(f"bench: adaptive warm-up, {len(todo)} requests ({tasks})")
    outcomes, _ = run_items(url, model, todo, concurrency=1, max_tokens=max_tokens)
    return outcomes


def _decode_tok_s(o: dict[str, Any]) -> float | None:
    """A request's decode speed as the gateway learns it: tokens after the first over the
    seconds after it (prefill, queueing and prefix-cache hits left out)."""
    itl = o.get("itl_s")
    return 1.0 / itl if itl else None


def _e2e_tok_s(outs: Sequence[dict[str, Any]]) -> float | None:
    """The bench's tok/s: sum of tokens over sum of end-to-end seconds."""
    ok = [o for o in outs if not o["error"] and o["e2e_s"]]
    seconds = sum(o["e2e_s"] for o in ok)
    return sum(o["output_tokens"] for o in ok) / seconds if seconds else None


def _median(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def checks(runs: Sequence[dict[str, Any]], warm: Sequence[Outcome]) -> list[dict[str, Any]]:
    """Per task at concurrency 1: adaptive vs static rules vs the oracle (the best single
    backend), by median decode tok/s (primary: what adaptive optimizes) and by the bench's
    end-to-end tok/s; how often each gateway used the oracle's backend; the exploration
    cost (warm-up and measured requests off the oracle, and their extra decode seconds)."""
    outs = {r["target"]: r["outcomes"] for r in runs if r["concurrency"] == 1}
    singles = [t for t in outs if t not in (TARGET, STATIC)]
    results = []
    for task in TASKS:
        mine = {t: [o for o in v if o["task"] == task] for t, v in outs.items()}
        decode = {t: _median([_decode_tok_s(o) for o in v]) for t, v in mine.items()}
        e2e = {t: _e2e_tok_s(v) for t, v in mine.items()}
        if not mine.get(TARGET) or not any(decode.get(s) for s in singles):
            continue
        oracle = max(singles, key=lambda s: decode.get(s) or 0.0)
        e2e_oracle = max(singles, key=lambda s: e2e.get(s) or 0.0)
        served = [o.to_json() for o in warm if o.task == task] + mine[TARGET]
        off = [o for o in served if o["backend"] and o["backend"] != oracle]
        per_token = 1.0 / (decode[oracle] or 1.0)
        extra = sum(
            max(0.0, o["e2e_s"] - (o["ttft_s"] or 0.0) - (o["output_tokens"] - 1) * per_token)
            for o in off
            if o["e2e_s"] and o["output_tokens"] > 1
        )
        row: dict[str, Any] = {
            "task": task,
            "oracle": oracle,
            "decode_tok_s": {t: decode.get(t) for t in (TARGET, STATIC, oracle)},
            "ratio_to_oracle": _ratio(decode[TARGET], decode[oracle]),
            "ratio_to_static": _ratio(decode[TARGET], decode.get(STATIC)),
            "e2e_oracle": e2e_oracle,
            "e2e_tok_s": {t: e2e.get(t) for t in (TARGET, STATIC, e2e_oracle)},
            "e2e_ratio_to_oracle": _ratio(e2e[TARGET], e2e[e2e_oracle]),
            "e2e_ratio_to_static": _ratio(e2e[TARGET], e2e.get(STATIC)),
            "on_oracle": {
                t: f"{sum(1 for o in mine.get(t, []) if o['backend'] == oracle)}"
                f"/{len(mine.get(t, []))}"
                for t in (TARGET, STATIC)
            },
            "warmup_requests": sum(1 for o in warm if o.task == task),
            "off_oracle_requests": len(off),
            "off_oracle_extra_s": extra,
        }
        routes = {t: {o["id"]: o["backend"] for o in mine.get(t, [])} for t in (TARGET, STATIC)}
        row["same_routing_as_static"] = routes[TARGET] == routes[STATIC]
        ratio, vs_static = row["ratio_to_oracle"], row["ratio_to_static"]
        row["within_3pct_of_oracle"] = ratio is not None and ratio >= WITHIN_ORACLE
        row["at_least_static"] = vs_static is None or vs_static >= 1.0
        results.append(row)
    return results


def markdown(results: Sequence[dict[str, Any]], warm: Sequence[Outcome]) -> str:
    """The adaptive section of ``speedup.md``."""
    lines = [
        "",
        "## Adaptive routing (issue #7), concurrency 1",
        "",
        f"Warm-up: {len(warm)} requests, one at a time, on prompts outside the sample, only "
        "those the adaptive gateway's rules leave a choice for. Decode tok/s: median over "
        "requests of (tokens - 1) / (end-to-end - first token), what adaptive routing "
        "optimizes (unaffected by prefill and by prefix-cache hits a target gets when another "
        "target sent the same prompt to the same backend just before); e2e: the table's tok/s. "
        "Oracle: the best single backend per task by decode tok/s. Off-oracle requests: "
        "warm-up and measured requests the adaptive gateway sent elsewhere; extra s: their "
        "decode time beyond the oracle's speed. Where both gateways sent every request to the "
        "same backend, their difference is the machine's noise.",
        "",
        "| task | oracle | decode tok/s adaptive / static / oracle | adaptive vs oracle "
        "| adaptive vs static | e2e vs oracle / vs static | on the oracle's backend "
        "(adaptive, static) | warm-up | off-oracle requests | extra s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        d = r["decode_tok_s"]
        lines.append(
            f"| {r['task']} | {r['oracle']} | {_f(d[TARGET])} / {_f(d[STATIC])} / "
            f"{_f(d[r['oracle']])} | {_f(r['ratio_to_oracle'], 3)} "
            f"({'met' if r['within_3pct_of_oracle'] else 'NOT met'}) | "
            f"{_f(r['ratio_to_static'], 3)} ({_verdict(r)}) | "
            f"{_f(r['e2e_ratio_to_oracle'], 3)} / {_f(r['e2e_ratio_to_static'], 3)} | "
            f"{r['on_oracle'][TARGET]}, {r['on_oracle'][STATIC]} | {r['warmup_requests']} | "
            f"{r['off_oracle_requests']} | {r['off_oracle_extra_s']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def report(out: Path, runs: Sequence[dict[str, Any]], warm: Sequence[Outcome]) -> None:
    """Add the adaptive section to ``speedup.md`` and ``adaptive`` to ``results.json``."""
    results = checks(runs, warm)
    with (out / "speedup.md").open("a") as f:
        f.write(markdown(results, warm))
    path = out / "results.json"
    data = json.loads(path.read_text())
    data["adaptive"] = {"checks": results, "warmup": [o.to_json() for o in warm]}
    path.write_text(json.dumps(data, indent=1))


def _verdict(row: dict[str, Any]) -> str:
    if row["at_least_static"]:
        return "met"
    return "same backends: noise" if row["same_routing_as_static"] else "NOT met"


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
