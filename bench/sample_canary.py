"""``python -m bench.sample_canary``: the distribution canary against a faulty and healthy
speculative backends, in simulated time.

The real :class:`~gateway.upstream.sample_canary.SampleCanary` runs its rounds over
``config/local.yaml``'s four backends, answered in-process (``httpx.MockTransport``) by a toy
target model (:mod:`bench.toy_lm`, SmolLM2's vocabulary): ``plain`` and two speculative
backends sample from it exactly; the faulty one replaces ``--fault`` (default 1%) of its
sampled tokens with uniformly random ones, greedy untouched. Its clock advances one
interval per round, so hours take seconds.

Targets (issue #24): the faulty backend is taken off sampled traffic (``sample_suspect``)
within 10 minutes; no false alarm on a healthy backend over an hour. Reported per budget:
detection times over ``--trials`` runs (median, 90th percentile, share within 10 min),
false alarms over ``--hours`` simulated healthy hours, and the budget's sampled tokens per
hour. Results go to stdout as JSON and (``--out``) a file; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from bench.toy_lm import ToyLM, completion_answer
from contracts.config import GatewayConfig, load_config
from gateway.upstream.sample_canary import SampleCanary, SampleCanaryBudget
from gateway.upstream.state import BackendRegistry

ROOT = Path(__file__).resolve().parents[1]
FAULTY = "ngram"
TEN_MINUTES = 600.0
#: Budgets compared: the shipped default (CPU stack) and one sized for the 10-minute target.
BUDGETS = {
    "default": SampleCanaryBudget(),
    "fast": SampleCanaryBudget(interval_s=60.0, prompts=4, max_tokens=64),
}


def transport(config: GatewayConfig, faults: dict[str, float], seed: int) -> httpx.MockTransport:
    """Every backend of ``config`` answered by the toy model (``faults``: per backend)."""
    lm, rng = ToyLM(), random.Random(seed)
    by_host = {b.base_url.removeprefix("http://"): n for n, b in config.backends.items()}

    def handle(request: httpx.Request) -> httpx.Response:
        name = by_host[request.url.netloc.decode()]
        body = json.loads(request.content)
        return httpx.Response(200, json=completion_answer(lm, body, rng, faults.get(name, 0.0)))

    return httpx.MockTransport(handle)


async def run(
    budget: SampleCanaryBudget, faults: dict[str, float], seed: int, until_s: float
) -> tuple[float | None, dict[str, int]]:
    """Rounds until ``until_s`` simulated seconds or the faulty backend's first alarm:
    ``(seconds to that alarm or None, rounds each healthy speculative backend spent
    suspect)``."""
    config = load_config(ROOT / "config" / "local.yaml")
    registry = BackendRegistry(config.backends)
    for state in registry.states.values():
        state.healthy = True
    now = [0.0]
    async with httpx.AsyncClient(transport=transport(config, faults, seed)) as client:
        canary = SampleCanary(
            client, lambda: config, registry, budget, timeout_s=5, clock=lambda: now[0]
        )
        false = dict.fromkeys((n for n in config.backends if n not in faults), 0)
        while now[0] < until_s:
            now[0] += budget.interval_s
            await canary.run_round()
            for name in false:
                false[name] += registry.states[name].sample_suspect is not None
            if any(registry.states[n].sample_suspect for n in faults):
                return now[0], false
    return None, false


async def measure(
    name: str, budget: SampleCanaryBudget, fault: float, trials: int, hours: float
) -> dict[str, Any]:
    """Detection times over ``trials`` faulty runs (capped at 24 h) and false alarms over
    ``hours`` healthy hours, for one budget."""
    times = []
    for t in range(trials):
        found, _ = await run(budget, {FAULTY: fault}, 1000 + t, 24 * 3600.0)
        times.append(found)
    detected = sorted(x for x in times if x is not None)
    times_or_cap = [24 * 3600.0 if x is None else x for x in times]  # undetected: the cap
    _, false = await run(budget, {}, 7, hours * 3600.0)
    per_hour = budget.rounds_per_hour() * 4 * budget.prompts * budget.max_tokens
    return {
        "budget": name,
        "settings": asdict(budget),
        "sampled_tokens_per_hour": per_hour,
        "fault_rate": fault,
        "trials": trials,
        "detected": len(detected),
        "median_s": statistics.median(detected) if detected else None,
        "p90_s": statistics.quantiles(times_or_cap, n=10)[-1] if trials > 1 else None,
        "within_10_min": sum(x <= TEN_MINUTES for x in detected) / max(trials, 1),
        "healthy_hours": hours,
        "false_alarm_rounds": false,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison and print (and write) the JSON report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fault", type=float, default=0.01)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--hours", type=float, default=10.0)
    parser.add_argument("--budget", choices=sorted(BUDGETS), action="append")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    report = [
        asyncio.run(measure(n, BUDGETS[n], args.fault, args.trials, args.hours))
        for n in args.budget or sorted(BUDGETS)
    ]
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
