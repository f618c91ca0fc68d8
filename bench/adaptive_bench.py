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
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.llm_client import Outcome, run_items
from bench.procs import Server, free_port
from bench.speedup_report import is_gateway
from bench.workloads import Item, sample
from contracts.tasks import TASKS

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
    argv = [sys.executable, "-m", "cli", "serve", "--config", str(path)]
    server = Server(
        TARGET,
        [*argv, "--port", str(port)],
        ready_url=f"http://127.0.0.1:{port}/ready",
        log_path=logs / "adaptive-gateway.log",
        env={"SPECGATE_STATE_FILE": str(work / "adaptive-state.json")},  # starts fresh
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


def _e2e_tok_s(outs: Sequence[dict[str, Any]]) -> float | None:
    """The bench's tok/s: sum of tokens over sum of end-to-end seconds."""
    ok = [o for o in outs if not o["error"] and o["e2e_s"]]
    seconds = sum(o["e2e_s"] for o in ok)
    return sum(o["output_tokens"] for o in ok) / seconds if seconds else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def checks(runs: Sequence[dict[str, Any]], warm: Sequence[Outcome]) -> list[dict[str, Any]]:
    """Per task at concurrency 1: adaptive vs static rules vs the oracle (the best single
    backend by tok/s), and the exploration cost.

    ``replayed``: each gateway's choices valued at the single backends' own measurements of
    the same prompts (same prompt, same backend, same tokens), which compares decisions
    free of the gateway's own cost and of the machine's noise between runs; ``measured``:
    the gateways' own requests. Off-oracle requests: warm-up and measured requests the
    adaptive gateway sent elsewhere; extra s: their seconds beyond the oracle's (replayed
    for measured requests, at the oracle's tok/s for warm-up ones).
    """
    outs = {r["target"]: r["outcomes"] for r in runs if r["concurrency"] == 1}
    singles = [t for t in outs if not is_gateway(t)]
    by_id = {t: {o["id"]: o for o in v} for t, v in outs.items()}
    results = []
    for task in TASKS:
        mine = {t: [o for o in v if o["task"] == task] for t, v in outs.items()}
        measured = {t: _e2e_tok_s(v) for t, v in mine.items()}
        if not mine.get(TARGET) or not any(measured.get(s) for s in singles):
            continue
        oracle = max(singles, key=lambda s: measured.get(s) or 0.0)

        def replay(target: str, mine: dict[str, list[dict[str, Any]]] = mine) -> float | None:
            picked = [by_id.get(o["backend"], {}).get(o["id"]) for o in mine.get(target, [])]
            return _e2e_tok_s([p for p in picked if p is not None])

        replayed = {STATIC: replay(STATIC), TARGET: replay(TARGET), oracle: measured[oracle]}
        off_warm = [o for o in warm if o.task == task and o.backend not in (None, oracle)]
        off = [o for o in mine[TARGET] if o["backend"] not in (None, oracle) and not o["error"]]
        per_token = 1.0 / (measured[oracle] or 1.0)
        extra = 0.0
        for w in off_warm:
            extra += max(0.0, (w.e2e_s or 0.0) - w.output_tokens * per_token)
        for o in off:
            chosen = by_id.get(o["backend"], {}).get(o["id"])
            best = by_id[oracle].get(o["id"])
            if chosen and best and chosen["e2e_s"] and best["e2e_s"]:
                extra += max(0.0, chosen["e2e_s"] - best["e2e_s"])
        row: dict[str, Any] = {
            "task": task,
            "oracle": oracle,
            "routed": {  # answered requests only; failed ones are counted apart
                t: dict(Counter(o["backend"] for o in mine.get(t, []) if not o["error"]))
                for t in (TARGET, STATIC)
            },
            "failed": {t: sum(1 for o in mine.get(t, []) if o["error"]) for t in outs},
            "replayed_tok_s": replayed,
            "measured_tok_s": {t: measured.get(t) for t in (TARGET, STATIC, oracle)},
            "ratio_to_oracle": _ratio(replayed[TARGET], replayed[oracle]),
            "ratio_to_static": _ratio(replayed[TARGET], replayed[STATIC]),
            "measured_ratio_to_oracle": _ratio(measured[TARGET], measured[oracle]),
            "measured_ratio_to_static": _ratio(measured[TARGET], measured.get(STATIC)),
            "warmup_requests": sum(1 for o in warm if o.task == task),
            "off_oracle_requests": len(off_warm) + len(off),
            "off_oracle_extra_s": extra,
        }
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
        "those the adaptive gateway's rules leave a choice for. Oracle: the best single "
        "backend per task (tok/s). Replayed: each gateway's choices valued at the single "
        "backends' own measurements of the same prompts (decisions compared without the "
        "gateway's cost and the machine's run-to-run noise); measured: the gateways' own "
        "requests. Off-oracle: warm-up and measured requests adaptive sent elsewhere; extra s: "
        "their seconds beyond the oracle's.",
        "",
        "| task | oracle | adaptive routed to | static routed to | replayed tok/s adaptive "
        "/ static / oracle | vs oracle | vs static | measured vs oracle / vs static "
        "| warm-up | off-oracle requests | extra s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rep, routed, failed = r["replayed_tok_s"], r["routed"], r.get("failed", {})
        lines.append(
            f"| {r['task']} | {r['oracle']} | {_counts(routed[TARGET], failed.get(TARGET))} | "
            f"{_counts(routed[STATIC], failed.get(STATIC))} | "
            f"{_f(rep[TARGET])} / {_f(rep[STATIC])} / "
            f"{_f(rep[r['oracle']])} | {_f(r['ratio_to_oracle'], 3)} "
            f"({'met' if r['within_3pct_of_oracle'] else 'NOT met'}) | "
            f"{_f(r['ratio_to_static'], 3)} ({'met' if r['at_least_static'] else 'NOT met'}) | "
            f"{_f(r['measured_ratio_to_oracle'], 3)} / {_f(r['measured_ratio_to_static'], 3)} | "
            f"{r['warmup_requests']} | {r['off_oracle_requests']} | "
            f"{r['off_oracle_extra_s']:.1f} |"
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


def without_prefix_cache(config_path: Path, work: Path) -> Path:
    """A copy of the config whose local backends run ``--no-enable-prefix-caching``.

    Every target of a wave sends the same prompt; with prefix caching, whichever reaches a
    backend second skips most of the prefill (measured here: 0.04 s instead of 0.86 s time
    to first token on rag prompts), so comparisons would depend on the random order.
    """
    data = yaml.safe_load(config_path.read_text())
    for backend in data["backends"].values():
        profile = backend.get("profile")
        if backend.get("local") and profile is not None:
            profile["extra_args"] = [*profile.get("extra_args", []), "--no-enable-prefix-caching"]
    path = work / "no-prefix-cache.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _counts(counts: dict[str, int], failed: int | None = None) -> str:
    """``ngram 7, plain 1`` (any key type sorts: a missing backend is ``None``), plus
    ``failed N`` when requests failed."""
    parts = [f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: str(kv[0]))]
    return ", ".join(parts + ([f"failed {failed}"] if failed else []))


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
