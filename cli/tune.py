"""``specgate tune --config FILE``: read the live speculative backends' acceptance and print
the ``num_speculative_tokens`` to use next (see :mod:`gateway.speculation.advisor`).

vLLM's ``spec_decode`` counters are cumulative since the server started. The command reads
each backend's ``/metrics`` twice, ``--interval`` seconds apart (default 10), and advises on
the difference: what the server is serving now. When the interval saw fewer than
``--min-drafts`` drafts (an idle server), or with ``--interval 0``, one read is used as a
window of its own, from server start (all counters zero) to now: just as valid for a server
that has served representative traffic, only slower to follow a change of traffic.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from contracts.acceptance import AcceptanceWindow, SpecCounters
from contracts.config import BackendConfig, ConfigError, load_config
from contracts.vllm_metrics import parse_vllm_metrics
from gateway.speculation.advisor import DEFAULT_KNOBS, Advice, Knobs, advise_window


@dataclass(frozen=True, slots=True)
class TuneResult:
    """One backend's outcome: the advice (its ``window`` says what it covers), or why there
    is none."""

    name: str
    advice: Advice | None
    error: str | None = None


def add_tune_command(sub: Any) -> None:
    """Add the ``tune`` subcommand to ``specgate``'s subparsers."""
    tune = sub.add_parser(
        "tune", help="read live backends' acceptance and recommend num_speculative_tokens"
    )
    tune.add_argument("--config", type=Path, required=True, help="gateway config YAML")
    tune.add_argument(
        "--interval",
        type=float,
        default=10.0,
        help="seconds between the two /metrics reads (0: one read, counters since start)",
    )
    tune.add_argument("--min-drafts", type=float, default=50, help="drafts a window needs")
    tune.add_argument(
        "--position-floor",
        type=float,
        default=0.3,
        help="least per-position acceptance worth drafting for",
    )
    tune.add_argument(
        "--draft-cost", type=float, help="draft step cost relative to a target step (c)"
    )
    tune.add_argument("--json", action="store_true", help="print JSON instead of a table")


def window_advice(
    backend: BackendConfig,
    first: SpecCounters,
    second: SpecCounters | None,
    seconds: float,
    knobs: Knobs = DEFAULT_KNOBS,
) -> Advice | None:
    """Advice over ``first -> second`` (``seconds`` apart) when that holds at least
    ``knobs.min_drafts`` drafts, else over the newest read's counters since server start (see
    :func:`~gateway.speculation.advisor.advise_window`)."""
    window = AcceptanceWindow(window_s=max(seconds, 1.0) * 2)
    window.add(0.0, first)
    if second is not None:
        window.add(seconds, second)
    return advise_window(backend.spec, window, knobs)


def read_counters(client: httpx.Client, backend: BackendConfig) -> SpecCounters:
    """The backend's cumulative ``spec_decode`` counters; raises ValueError when the page
    has none or cannot be read, ``httpx.HTTPError`` when the server does not answer."""
    response = client.get(f"{backend.base_url}/metrics")
    response.raise_for_status()
    counters = parse_vllm_metrics(response.text).spec
    if counters is None:
        raise ValueError("no spec_decode counters on /metrics")
    return counters


def tune(
    backends: dict[str, BackendConfig], interval_s: float, client: httpx.Client, knobs: Knobs
) -> list[TuneResult]:
    """Read every speculative backend (twice, ``interval_s`` apart, when > 0) and advise."""
    speculative = {n: b for n, b in backends.items() if b.spec.speculative}
    first: dict[str, SpecCounters | str] = {}
    for name, backend in speculative.items():
        first[name] = _read(client, backend)
    second: dict[str, SpecCounters | str] = {}
    if interval_s > 0 and any(isinstance(v, SpecCounters) for v in first.values()):
        time.sleep(interval_s)
        second = {
            n: _read(client, speculative[n]) for n, v in first.items() if not isinstance(v, str)
        }
    results = []
    for name, backend in speculative.items():
        a, b = first[name], second.get(name)
        if isinstance(a, str) or isinstance(b, str):
            results.append(TuneResult(name, None, a if isinstance(a, str) else str(b)))
            continue
        results.append(TuneResult(name, window_advice(backend, a, b, interval_s, knobs)))
    return results


def _read(client: httpx.Client, backend: BackendConfig) -> SpecCounters | str:
    try:
        return read_counters(client, backend)
    except (httpx.HTTPError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"


def format_report(results: list[TuneResult]) -> str:
    """A table (one row per backend) followed by each backend's reason and next config."""
    header = (
        "backend",
        "method",
        "k",
        "rate",
        "mean len",
        "tok/step now->next",
        "k next",
        "window",
    )
    rows = [header]
    for r in results:
        a = r.advice
        if a is None:
            rows.append((r.name, "-", "-", "-", "-", "-", "-", r.error or "-"))
            continue
        rate = "-" if a.rate is None else f"{a.rate:.1%}"
        length = "-" if a.mean_length is None else f"{a.mean_length:.2f}"
        steps = "-"
        if a.tokens_per_step_current is not None and a.tokens_per_step_recommended is not None:
            steps = f"{a.tokens_per_step_current:.2f} -> {a.tokens_per_step_recommended:.2f}"
        rows.append(
            (
                r.name,
                a.method,
                str(a.current_k),
                rate,
                length,
                steps,
                str(a.recommended_k),
                a.window,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    for r in results:
        lines.append("")
        if r.advice is None:
            lines.append(f"{r.name}: not read ({r.error})")
            continue
        lines.append(f"{r.name}: {r.advice.reason}")
        lines.append(f"  --speculative-config '{r.advice.speculative_config}'")
    return "\n".join(lines)


def run_tune(args: argparse.Namespace) -> int:
    """Run ``specgate tune``; exit 1 when the config is invalid or a backend was not read."""
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    knobs = Knobs(
        position_floor=args.position_floor, min_drafts=args.min_drafts, draft_cost=args.draft_cost
    )
    with httpx.Client(timeout=httpx.Timeout(5.0)) as client:
        results = tune(config.backends, args.interval, client, knobs)
    if not results:
        print(f"{args.config}: no speculative backend")
        return 0
    if args.json:
        payload: list[dict[str, Any]] = [
            {
                "backend": r.name,
                "error": r.error,
                "advice": None if r.advice is None else r.advice.to_json(),
            }
            for r in results
        ]
        print(json.dumps(payload, indent=2))
    else:
        print(format_report(results))
    return 1 if any(r.advice is None for r in results) else 0
