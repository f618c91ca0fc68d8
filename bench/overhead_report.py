"""Aggregate overhead runs into medians, a Markdown table, PNG charts and raw JSON."""

from __future__ import annotations

import importlib.util
import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: specgate's targets (issue #6), shown beside its figures.
TARGETS = {"cpu_json_ms": 0.25, "cpu_stream_ms": 1.2, "added_ttfc_c1_ms": 0.5}
_METRICS = ("p50_ms", "p99_ms", "rps", "ttfc_p50_ms", "ttfc_p99_ms", "cpu_ms_per_request")


def _median(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None and v == v]
    return statistics.median(kept) if kept else None


def aggregate(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (scenario, target): medians over rounds, and per-round differences to ``direct``
    (added p50/p99/TTFC, throughput ratio) reduced to their medians."""
    by_key: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    direct: dict[tuple[str, int], dict[str, Any]] = {}
    for row in rows:
        by_key[(row["scenario"], row["target"])].append(row)
        if row["target"] == "direct":
            direct[(row["scenario"], row["round"])] = row
    out = []
    for (scenario, target), runs in by_key.items():
        agg: dict[str, Any] = {"scenario": scenario, "target": target, "runs": len(runs)}
        agg["requests"] = sum(r["requests"] for r in runs)
        agg["errors"] = sum(r["errors"] for r in runs)
        for metric in _METRICS:
            agg[metric] = _median([r.get(metric) for r in runs])
        base = [(r, direct.get((scenario, r["round"]))) for r in runs]
        pairs = [(r, d) for r, d in base if d is not None]
        for metric, name in (
            ("p50_ms", "added_p50_ms"),
            ("p99_ms", "added_p99_ms"),
            ("ttfc_p50_ms", "added_ttfc_p50_ms"),
        ):
            diffs = [r[metric] - d[metric] for r, d in pairs if r.get(metric) is not None]
            agg[name] = _median(diffs)
        agg["throughput_vs_direct"] = _median([r["rps"] / d["rps"] for r, d in pairs if d["rps"]])
        out.append(agg)
    return out


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(agg: Sequence[dict[str, Any]], targets: Sequence[str]) -> str:
    """The Markdown table: one row per scenario and target."""
    head = (
        "| scenario | target | p50 ms | added p50 | p99 ms | added p99 | TTFC p50 | "
        "added TTFC p50 | req/s | vs direct | CPU ms/req | errors |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    scenarios = list(dict.fromkeys(a["scenario"] for a in agg))
    index = {(a["scenario"], a["target"]): a for a in agg}
    for scenario in scenarios:
        for target in targets:
            a = index.get((scenario, target))
            if a is None:
                continue
            direct = target == "direct"
            lines.append(
                f"| {scenario} | {target} | {_fmt(a['p50_ms'])} | "
                f"{'' if direct else _fmt(a['added_p50_ms'])} | {_fmt(a['p99_ms'])} | "
                f"{'' if direct else _fmt(a['added_p99_ms'])} | {_fmt(a['ttfc_p50_ms'])} | "
                f"{'' if direct else _fmt(a['added_ttfc_p50_ms'])} | {a['rps']:.0f} | "
                f"{'' if direct else _fmt(a['throughput_vs_direct'])} | "
                f"{_fmt(a['cpu_ms_per_request'], 3)} | {a['errors']} |"
            )
    return head + "\n".join(lines) + "\n"


def target_check(agg: Sequence[dict[str, Any]], name: str = "specgate") -> str:
    """specgate's figures against its targets, one line each."""
    index = {(a["scenario"], a["target"]): a for a in agg if a["target"] == name}
    lines = []
    for (scenario, _), a in index.items():
        cpu = a["cpu_ms_per_request"]
        limit = TARGETS["cpu_stream_ms" if scenario.startswith("stream") else "cpu_json_ms"]
        ok = cpu is not None and cpu <= limit
        lines.append(
            f"- {scenario}: CPU {_fmt(cpu, 3)} ms/req (target <= {limit}) "
            f"{'met' if ok else 'NOT met'}"
        )
        if scenario == "stream c1":
            added = a["added_ttfc_p50_ms"]
            ok = added is not None and added <= TARGETS["added_ttfc_c1_ms"]
            lines.append(
                f"- stream c1: added TTFC p50 {_fmt(added)} ms "
                f"(target <= {TARGETS['added_ttfc_c1_ms']}) {'met' if ok else 'NOT met'}"
            )
    return "\n".join(lines) + "\n"


def charts(agg: Sequence[dict[str, Any]], targets: Sequence[str], out: Path) -> list[Path]:
    """Grouped bar charts of CPU per request and added p50 latency, per scenario."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = list(dict.fromkeys(a["scenario"] for a in agg))
    index = {(a["scenario"], a["target"]): a for a in agg}
    paths = []
    for metric, title, fname, skip_direct, log in (
        (
            "cpu_ms_per_request",
            "Gateway CPU time per request (ms, log scale)",
            "overhead-cpu.png",
            True,
            True,
        ),
        (
            "added_p50_ms",
            "Added p50 latency vs direct (ms, log scale)",
            "overhead-latency.png",
            True,
            True,
        ),
        (
            "throughput_vs_direct",
            "Throughput relative to direct",
            "overhead-throughput.png",
            True,
            False,
        ),
    ):
        shown = [t for t in targets if not (skip_direct and t == "direct")]
        fig, ax = plt.subplots(figsize=(11, 4.5))
        width = 0.8 / max(len(shown), 1)
        for i, target in enumerate(shown):
            values = [(index.get((s, target)) or {}).get(metric) for s in scenarios]
            xs = [j + i * width for j in range(len(scenarios))]
            ax.bar(xs, [max(v or 0.0, 1e-3) for v in values], width, label=target)
        ax.set_xticks([j + width * (len(shown) - 1) / 2 for j in range(len(scenarios))])
        ax.set_xticklabels(scenarios)
        if log:
            ax.set_yscale("log")
        ax.set_title(title)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        path = out / fname
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def _busy_note(load: dict[str, float], cores: int) -> str:
    """A warning when the load average exceeded the core count (other work shared the CPUs;
    the benchmark itself keeps it around 1-2)."""
    if max(load["start"], load["end"]) > cores:
        return " (above the core count: other work shared the CPUs)"
    return ""


def write(out: Path, rows: Sequence[dict[str, Any]], meta: dict[str, Any]) -> None:
    """``results.json``, ``overhead.md`` and the charts into ``out``."""
    agg = aggregate(rows)
    targets = list(dict.fromkeys(r["target"] for r in rows))
    m = meta["machine"]
    md = (
        f"# Gateway overhead ({m['date']})\n\n"
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, Python "
        f"{m['python']}; {meta['rounds']} rounds x {meta['duration_s']:g} s per run; "
        f"gateways pinned to their own core: {meta['pinned']}; load average "
        f"{meta['load_average']['start']:.1f} at start, {meta['load_average']['end']:.1f} at "
        f"end{_busy_note(meta['load_average'], m['cores'])}. Medians over rounds; "
        "'added' = target minus direct in the same round; CPU = gateway process tree.\n\n"
        + table(agg, targets)
        + "\nspecgate vs its targets:\n\n"
        + target_check(agg)
    )
    for target in targets:
        if target.startswith("specgate["):
            md += f"\n{target} vs the same targets:\n\n" + target_check(agg, target)
    (out / "overhead.md").write_text(md)
    (out / "results.json").write_text(
        json.dumps({"meta": meta, "aggregate": agg, "runs": list(rows)}, indent=1)
    )
    if importlib.util.find_spec("matplotlib") is None:  # a bench extra
        print("charts skipped: matplotlib is not installed (pip install -e '.[bench]')")
    else:
        charts(agg, targets, out)


def main() -> None:
    """``python -m bench.overhead_report OUT``: re-render OUT's table and charts from its
    ``results.json``."""
    import sys

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "bench/out/overhead")
    data = json.loads((out / "results.json").read_text())
    write(out, data["runs"], data["meta"])


if __name__ == "__main__":
    main()
