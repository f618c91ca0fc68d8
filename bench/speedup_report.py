"""Turn speedup runs into per-task figures, the target check, a Markdown table and charts."""

from __future__ import annotations

import importlib.util
import json
import platform
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.load import percentile
from bench.procs import machine
from contracts.tasks import TASKS

#: specgate's targets (issue #6): per task within 5% of the best single backend, and never
#: slower than the plain backend overall.
WITHIN_BEST = 0.95
#: Targets that are gateways, not single backends (``adaptive``: bench.adaptive_bench;
#: ``adaptive-...``: bench.speedup's ``--extra-gateway`` variants; ``static``:
#: bench.sim_fleet's ``--static``).
GATEWAYS = ("specgate", "adaptive", "static")
#: The prefix of bench.speedup's ``--relay`` targets: relays in front of one backend, neither
#: a single backend (never the oracle) nor one of specgate's gateways.
RELAY = "relay-"


def is_gateway(target: str) -> bool:
    """Whether ``target`` names a gateway (or a ``--relay``) rather than a single backend:
    gateways are never an oracle candidate."""
    return target in GATEWAYS or target.startswith(("adaptive-", RELAY))


def _ms(values: list[float], q: float) -> float | None:
    return percentile(values, q) * 1000 if values else None


def summarize(outcomes: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Figures over some requests: tokens/s (sum tokens / sum e2e), TTFT p50/p99, ITL p50,
    e2e p50/p99 (ms), requests and errors."""
    ok = [o for o in outcomes if not o["error"] and o["e2e_s"]]
    tokens = sum(o["output_tokens"] for o in ok)
    seconds = sum(o["e2e_s"] for o in ok)
    ttft = [o["ttft_s"] for o in ok if o["ttft_s"] is not None]
    itl = [o["itl_s"] for o in ok if o["itl_s"] is not None]
    e2e = [o["e2e_s"] for o in ok]
    rates = [o["output_tokens"] / o["e2e_s"] for o in ok]
    return {
        "requests": len(outcomes),
        "errors": len(outcomes) - len(ok),
        "output_tokens": tokens,
        "tok_s": tokens / seconds if seconds else None,
        "tok_s_p50": percentile(rates, 50) if rates else None,
        "ttft_p50_ms": _ms(ttft, 50),
        "ttft_p99_ms": _ms(ttft, 99),
        "itl_p50_ms": _ms(itl, 50),
        "e2e_p50_ms": _ms(e2e, 50),
        "e2e_p99_ms": _ms(e2e, 99),
    }


def aggregate(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (concurrency, target, task) plus an ``all`` task per run."""
    rows = []
    for run in runs:
        for task in (*TASKS, "all"):
            outs = [o for o in run["outcomes"] if task in ("all", o["task"])]
            if not outs:
                continue
            row = {"concurrency": run["concurrency"], "target": run["target"], "task": task}
            row |= summarize(outs)
            if task == "all":
                row["throughput_tok_s"] = row["output_tokens"] / run["wall_s"]
            routed = Counter(o["backend"] for o in outs if o["backend"] and not o["error"])
            row["routed"] = dict(routed)
            rows.append(row)
    return rows


def checks(rows: Sequence[dict[str, Any]], key: str = "tok_s_p50") -> list[dict[str, Any]]:
    """Per (concurrency, task): specgate vs the best single backend; per concurrency and
    overall: specgate vs plain. Compared on ``key``: by default the median per-request
    tokens/s, which one request slowed by other work on the machine cannot swing the way it
    swings the sum-over-sum figure."""
    index = {(r["concurrency"], r["target"], r["task"]): r for r in rows}
    out = []
    for concurrency in sorted({r["concurrency"] for r in rows}):
        singles = sorted({r["target"] for r in rows if not is_gateway(r["target"])})
        for task in (*TASKS, "all"):
            gate = index.get((concurrency, "specgate", task))
            cands = [
                index[(concurrency, s, task)] for s in singles if (concurrency, s, task) in index
            ]
            cands = [c for c in cands if c[key]]
            if gate is None or not gate[key] or not cands:
                continue
            best = max(cands, key=lambda c: c[key])
            plain = index.get((concurrency, "plain", task))
            check = {
                "concurrency": concurrency,
                "task": task,
                "specgate_tok_s": gate[key],
                "best": best["target"],
                "best_tok_s": best[key],
                "ratio_to_best": gate[key] / best[key],
            }
            check["within_5pct_of_best"] = check["ratio_to_best"] >= WITHIN_BEST
            if plain and plain[key]:
                check["ratio_to_plain"] = gate[key] / plain[key]
            out.append(check)
    return out


def failures(runs: Sequence[dict[str, Any]]) -> list[str]:
    """Report lines on failed requests: per run, how many failed and their distinct errors
    (the figures above count answered requests only; a failed request is never fatal)."""
    lines = ["", "Failed requests (not counted in the figures above):", ""]
    any_failed = False
    for run in runs:
        errors = Counter(o["error"] for o in run["outcomes"] if o["error"])
        if not errors:
            continue
        any_failed = True
        shown = "; ".join(f"{n}x {str(e)[:120]}" for e, n in errors.most_common(3))
        lines.append(
            f"- c{run['concurrency']} {run['target']}: {sum(errors.values())} of "
            f"{len(run['outcomes'])} failed: {shown}"
        )
    return lines if any_failed else ["", "Failed requests: none."]


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(
    rows: Sequence[dict[str, Any]], runs: Sequence[dict[str, Any]], meta: dict[str, Any]
) -> str:
    """The report: per-task table, acceptance per run, specgate's routing, target check."""
    lines = [
        f"# Speculative decoding speedup ({meta['date']})\n",
        f"Machine: {meta['machine']}. Config `{meta['config']}`; {meta['per_task']} prompts "
        f"per task, {meta['max_tokens']} output tokens max, prompts cut to "
        f"{meta['max_prompt_chars']} characters; {meta.get('waves', 'mixed')} waves; "
        f"{'' if meta.get('prefix_cache', True) else 'servers without prefix caching; '}"
        f"took {meta['elapsed_s'] / 60:.1f} min.\n",
        "| c | task | target | tok/s | tok/s p50 | TTFT p50 ms | TTFT p99 | ITL p50 ms | "
        "e2e p50 ms | e2e p99 | errors | specgate routed to |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        routed = ", ".join(f"{k} {v}" for k, v in sorted(r["routed"].items()))
        lines.append(
            f"| {r['concurrency']} | {r['task']} | {r['target']} | {_f(r['tok_s'])} | "
            f"{_f(r['tok_s_p50'])} | "
            f"{_f(r['ttft_p50_ms'], 0)} | {_f(r['ttft_p99_ms'], 0)} | {_f(r['itl_p50_ms'])} | "
            f"{_f(r['e2e_p50_ms'], 0)} | {_f(r['e2e_p99_ms'], 0)} | {r['errors']} | {routed} |"
        )
    lines += ["", "Acceptance rate (accepted / drafted tokens during each run):", ""]
    for run in runs:
        acc = ", ".join(
            f"{name} {a['rate']:.0%} ({a['accepted_tokens']:.0f}/{a['draft_tokens']:.0f})"
            for name, a in run["acceptance"].items()
            if a["draft_tokens"]
        )
        lines.append(f"- c{run['concurrency']} {run['target']}: {acc or 'no drafts'}")
    lines += failures(runs)
    lines += ["", "specgate vs targets (median tokens/s per request, `tok/s p50`):", ""]
    for c in checks(rows):
        verdict = "met" if c["within_5pct_of_best"] else "NOT met"
        plain = f"; {c['ratio_to_plain']:.2f}x plain" if "ratio_to_plain" in c else ""
        lines.append(
            f"- c{c['concurrency']} {c['task']}: {c['ratio_to_best']:.2f}x the best single "
            f"backend ({c['best']}){plain}: within 5% {verdict}"
        )
    return "\n".join(lines) + "\n"


def charts(rows: Sequence[dict[str, Any]], out: Path) -> None:
    """One bar chart per concurrency: tokens/s per task and target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for concurrency in sorted({r["concurrency"] for r in rows}):
        sub = [r for r in rows if r["concurrency"] == concurrency]
        targets = list(dict.fromkeys(r["target"] for r in sub))
        tasks = list(dict.fromkeys(r["task"] for r in sub))
        index = {(r["target"], r["task"]): r["tok_s"] or 0.0 for r in sub}
        fig, ax = plt.subplots(figsize=(9, 4.5))
        width = 0.8 / len(targets)
        for i, target in enumerate(targets):
            xs = [j + i * width for j in range(len(tasks))]
            ax.bar(xs, [index.get((target, t), 0.0) for t in tasks], width, label=target)
        ax.set_xticks([j + width * (len(targets) - 1) / 2 for j in range(len(tasks))])
        ax.set_xticklabels(tasks)
        ax.set_ylabel("output tokens/s per request")
        ax.set_title(f"Tokens/s per request by task, concurrency {concurrency}")
        ax.legend()
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / f"speedup-c{concurrency}.png", dpi=110)
        plt.close(fig)


def write(out: Path, runs: Sequence[dict[str, Any]], meta: dict[str, Any]) -> None:
    """``results.json``, ``speedup.md`` and charts into ``out``."""
    m = machine()
    here = f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, Python "
    meta = {"date": m["date"], "machine": here + platform.python_version()} | meta
    rows = aggregate(runs)
    (out / "speedup.md").write_text(markdown(rows, runs, meta))
    (out / "results.json").write_text(
        json.dumps(
            {"meta": meta, "rows": rows, "checks": checks(rows), "runs": list(runs)}, indent=1
        )
    )
    if importlib.util.find_spec("matplotlib") is None:  # a bench extra
        print("charts skipped: matplotlib is not installed (pip install -e '.[bench]')")
    else:
        charts(rows, out)


def main() -> None:
    """``python -m bench.speedup_report OUT``: re-render OUT's report from its results.json."""
    import sys

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "bench/out/speedup")
    data = json.loads((out / "results.json").read_text())
    write(out, data["runs"], data["meta"])


if __name__ == "__main__":
    main()
