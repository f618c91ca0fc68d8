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
detection times over ``--trials`` runs (median, 90th and 95th percentile, share within 10
min), false alarms over ``--hours`` simulated healthy hours, and the budget's sampled tokens
per hour. Results go to stdout as JSON and (``--out``) a file; nothing is asserted.

``--live RATE`` (repeatable) adds runs with **live scoring**
(:mod:`gateway.upstream.live_scoring`) at its default budget beside the canary's default
rounds, under an assumed ordinary traffic: each speculative backend gets RATE non-streamed
sampled requests a minute, evenly spaced, each a prompt of ``--prompt-words`` random words
(one toy token each) and ``--tokens`` sampled tokens, its temperature uniform in [0.1, 1.0]
(the issue's range for sampled traffic); every request goes through the scorer as on the
request path (asked for its ids within the budget, its answer's ids stripped and queued),
and the queue is drained after each wave, the scorer judging each stream at most once a
minute. Until the alarm the faulty backend keeps its traffic. ``--live 0``: live scoring on
but no such traffic (the canary's rounds alone, at the level they keep beside live scoring).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.toy_lm import ToyLM, completion_answer
from contracts.config import GatewayConfig, load_config
from gateway.trace import RequestTrace
from gateway.upstream.live_scoring import LiveScorer, LiveScoringBudget
from gateway.upstream.sample_canary import SampleCanary, SampleCanaryBudget
from gateway.upstream.state import BackendRegistry, Backends

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


@dataclass(frozen=True, slots=True)
class Traffic:
    """The assumed ordinary traffic to each speculative backend (module docstring):
    ``rate`` sampled requests a minute of ``tokens`` sampled tokens after a prompt of
    ``prompt_words`` words, temperatures uniform in [``t_low``, ``t_high``]."""

    rate: float
    tokens: int = 128
    prompt_words: int = 100
    t_low: float = 0.1
    t_high: float = 1.0


async def live_request(
    scorer: LiveScorer,
    client: httpx.AsyncClient,
    config: GatewayConfig,
    name: str,
    traffic: Traffic,
    rng: random.Random,
) -> None:
    """One ordinary sampled request answered by ``name``, through the scorer as the
    routed endpoint does it (:meth:`gateway.upstream.live_scoring.LiveScorer.attach`)."""
    backend = config.backends[name]
    words = " ".join(f"w{rng.randrange(50_000)}" for _ in range(traffic.prompt_words))
    body = {
        "model": backend.served_model,
        "prompt": words,
        "max_tokens": traffic.tokens,
        "temperature": round(rng.uniform(traffic.t_low, traffic.t_high), 3),
    }
    trace = RequestTrace(f"r{rng.getrandbits(32):08x}", "/v1/completions", False)
    trace.backend = name
    taken = scorer.attach("/v1/completions", body, json.dumps(body).encode(), name, trace)
    if taken is None:
        return
    sent, wrap = taken
    resp = await client.post(f"{backend.base_url}/v1/completions", content=sent)
    tap = wrap(None)
    assert tap is not None
    tap.feed(resp.content)
    tap.close()


async def run_live(
    budget: SampleCanaryBudget,
    live: LiveScoringBudget,
    traffic: Traffic,
    faults: dict[str, float],
    seed: int,
    until_s: float,
) -> tuple[float | None, dict[str, int], dict[str, int]]:
    """The canary's rounds plus live scoring of ``traffic`` until ``until_s`` simulated
    seconds or the faulty backend's first alarm: ``(seconds to that alarm or None, alarms
    raised on each healthy speculative backend, the scorer's counters)``."""
    config = load_config(ROOT / "config" / "local.yaml")
    registry = BackendRegistry(config.backends)
    for state in registry.states.values():
        state.healthy = True
    now, rng = [0.0], random.Random(seed)
    speculative = [n for n, b in config.backends.items() if b.spec.speculative]
    false = dict.fromkeys((n for n in speculative if n not in faults), 0)

    def alarmed() -> bool:
        for name in false:
            was = name in suspect
            if registry.states[name].sample_suspect is not None:
                suspect.add(name)
                false[name] += not was
            else:
                suspect.discard(name)
        return any(registry.states[n].sample_suspect for n in faults)

    suspect: set[str] = set()
    async with httpx.AsyncClient(transport=transport(config, faults, seed)) as client:
        backends = Backends(client, lambda: config, registry)
        canary = SampleCanary(backends, budget, timeout_s=5, clock=lambda: now[0])
        scorer = LiveScorer(canary, live, clock=lambda: now[0], monotonic=lambda: now[0])
        t, next_round = 0.0, budget.interval_s
        step = 60.0 / traffic.rate if traffic.rate > 0 else budget.interval_s  # 0: no traffic
        while t < until_s:
            t += step
            while next_round <= t:
                now[0] = next_round
                await canary.run_round()
                next_round += budget.interval_s
                if alarmed():
                    return now[0], false, dict(scorer.counts)
            now[0] = t
            for name in speculative if traffic.rate > 0 else ():
                await live_request(scorer, client, config, name, traffic, rng)
            await scorer.drain()
            if alarmed():
                return t, false, dict(scorer.counts)
    return None, false, dict(scorer.counts)


async def measure_live(traffic: Traffic, fault: float, trials: int, hours: float) -> dict[str, Any]:
    """Detection times over ``trials`` faulty runs (capped at 24 h) and false alarms over
    ``hours`` healthy hours, with live scoring at its default budget beside the canary's
    default rounds."""
    budget, live = SampleCanaryBudget(), LiveScoringBudget()
    times = []
    for t in range(trials):
        found, _, _ = await run_live(budget, live, traffic, {FAULTY: fault}, 1000 + t, 24 * 3600.0)
        times.append(found)
    _, false, counts = await run_live(budget, live, traffic, {}, 7, hours * 3600.0)
    report = summary(times, trials)
    return {
        "budget": "default + live",
        "live": asdict(live),
        "traffic": asdict(traffic),
        "fault_rate": fault,
        **report,
        "healthy_hours": hours,
        "false_alarms": false,
        "healthy_run_counts": counts,
    }


def summary(times: list[float | None], trials: int) -> dict[str, Any]:
    """Median, 90th/95th percentiles (undetected runs count as the cap) and the share
    within 10 minutes of detection ``times``."""
    detected = sorted(x for x in times if x is not None)
    capped = [24 * 3600.0 if x is None else x for x in times]
    cuts = statistics.quantiles(capped, n=20, method="inclusive") if trials > 1 else None
    return {
        "trials": trials,
        "detected": len(detected),
        "median_s": statistics.median(detected) if detected else None,
        "p90_s": cuts[17] if cuts else None,
        "p95_s": cuts[18] if cuts else None,
        "within_10_min": sum(x <= TEN_MINUTES for x in detected) / max(trials, 1),
    }


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
        backends = Backends(client, lambda: config, registry)
        canary = SampleCanary(backends, budget, timeout_s=5, clock=lambda: now[0])
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
    parser.add_argument("--live", type=float, action="append", metavar="RATE")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--prompt-words", type=int, default=100)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    report = [
        asyncio.run(measure(n, BUDGETS[n], args.fault, args.trials, args.hours))
        for n in args.budget or ([] if args.live else sorted(BUDGETS))
    ]
    for rate in args.live or []:
        traffic = Traffic(rate, args.tokens, args.prompt_words)
        report.append(asyncio.run(measure_live(traffic, args.fault, args.trials, args.hours)))
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
