"""Waves of concurrent streams, direct to a server and through a gateway: where a wave's
time to first token goes.

    python -m bench.wave_probe --direct URL --gateway URL --model M --prompts DIR \
        --out sent.json [--n 48] [--waves 10] [--gap 0.05]
    python -m bench.wave_probe --analyse sent.json --marks marks.json

The first form sends ``--waves`` waves of ``--n`` streaming chat requests at once, ``--gap``
seconds apart (the benches' prompts of every task, 64 tokens, each task at its benches'
temperature), two rounds
each, alternating the server alone and the gateway (with ``X-Specgate-Speculation: off``, so
both serve from the same server), and prints each round's time to first token. Every request
carries an ``x-request-id``; ``--out`` gets ``{round: {id: [sent, first chunk, end]}}`` in
``time.monotonic()`` seconds. The second form reads those with the marks of a gateway run
under :mod:`bench.wave_marks` (same host, same clock) and prints, per gateway round, when
requests entered the gateway, how long its prepare stage took, when the backend answered and
when the client had its first chunk, and how far apart a wave's requests entered the gateway
(its serial cost per request). docs/benchmarks.md section 7, "Seventh run (session 15)".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp

from bench.load import percentile
from bench.workloads import TEMPERATURE


def bodies(prompts: Path, model: str, per_task: int) -> list[bytes]:
    """Streaming chat request bodies: ``per_task`` prompts of each task, their first 3,000
    characters (bench.speedup keeps head and tail, sends HumanEval rows to /v1/completions
    and seeds sampled requests; this probe sends every prompt as chat, unseeded), shuffled
    with a fixed seed."""
    out = []
    for task, temperature in TEMPERATURE.items():  # as the benches send each task
        lines = (prompts / f"{task}.jsonl").read_text().splitlines()[:per_task]
        for line in lines:
            prompt = json.loads(line)["prompt"][:3000]
            body = {
                "model": model,
                "messages": [{"role": "user", "content": prompt}],
                "stream": True,
                "max_tokens": 64,
                "temperature": temperature,
            }
            out.append(json.dumps(body).encode())
    random.Random(1).shuffle(out)
    return out


async def one(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    times: dict[str, list[float]],
) -> None:
    """One request; ``times[id]``: [sent, first chunk, end] (``time.monotonic()``)."""
    request_id = os.urandom(8).hex()
    marks = times[request_id] = [time.monotonic()]
    async with session.post(url, data=body, headers={**headers, "x-request-id": request_id}) as r:
        async for _ in r.content.iter_any():
            if len(marks) == 1:
                marks.append(time.monotonic())
    marks.append(time.monotonic())


async def waves(
    url: str,
    requests: list[bytes],
    n: int,
    count: int,
    headers: dict[str, str],
    gap_s: float = 0.05,
) -> dict[str, list[float]]:
    """``count`` waves of ``n`` requests at once (after one unrecorded warm-up wave),
    ``gap_s`` apart (50 ms: as bench.speedup settles between targets; 5 s: as one target's
    waves in bench.speedup, past the gateway's 4 s backend keep-alive); the times of the
    recorded ones."""
    times: dict[str, list[float]] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=n)) as session:
        for w in range(count + 1):
            batch = [requests[(w * n + i) % len(requests)] for i in range(n)]
            into: dict[str, list[float]] = {} if w == 0 else times
            await asyncio.gather(*(one(session, url, b, headers, into) for b in batch))
            await asyncio.sleep(gap_s)
    return times


def quantiles(values: Sequence[float]) -> str:
    """p10/p50/p90 of ``values`` (seconds) in ms, "p10/p50/p90" (:func:`bench.load.percentile`)."""
    return "/".join(f"{1000 * percentile(list(values), q):.1f}" for q in (10, 50, 90))


async def probe(args: argparse.Namespace) -> None:
    """The first form: rounds of waves, direct and through the gateway."""
    requests = bodies(args.prompts, args.model, 40)
    plain = {"content-type": "application/json"}
    through = {**plain, "x-specgate-speculation": "off"}
    out: dict[str, dict[str, list[float]]] = {}
    for n in range(2):
        for name, base, headers in (
            ("direct", args.direct, plain),
            ("gateway", args.gateway, through),
        ):
            times = await waves(
                f"{base}/v1/chat/completions", requests, args.n, args.waves, headers, args.gap
            )
            out[f"{name}{n}"] = times
            ttft = [t[1] - t[0] for t in times.values() if len(t) == 3]
            print(f"{name} round {n}: time to first token p10/p50/p90 {quantiles(ttft)} ms")
    args.out.write_text(json.dumps(out))


def analyse(sent: dict[str, dict[str, list[float]]], marks: dict[str, dict[str, float]]) -> None:
    """The second form (see the module docstring)."""
    for name, times in sent.items():
        done = {k: t for k, t in times.items() if len(t) == 3}
        ttft = [t[1] - t[0] for t in done.values()]
        print(f"{name}: {len(done)} requests, client TTFT p10/p50/p90 {quantiles(ttft)} ms")
        rows = []
        for request_id, t in done.items():
            m = marks.get(request_id, {})
            if all(k in m for k in ("entry", "prep0", "prep1", "open", "first")):
                rows.append({k: v - t[0] for k, v in m.items()} | {"sent": t[0]})
        if not rows:
            continue
        for label, key in (("entered", "entry"), ("answered", "open"), ("first out", "first")):
            print(f"  {label:<10} p10/p50/p90 {quantiles([r[key] for r in rows])} ms after sent")
        print(f"  prepare    p10/p50/p90 {quantiles([r['prep1'] - r['prep0'] for r in rows])} ms")
        rows.sort(key=lambda r: r["sent"])
        groups: list[list[dict[str, float]]] = [[rows[0]]]
        for r in rows[1:]:
            if r["sent"] - groups[-1][0]["sent"] >= 0.2:  # waves are >= 0.3 s apart
                groups.append([r])
            else:
                groups[-1].append(r)
        spacing = []
        for g in groups:
            entered = sorted(r["sent"] + r["entry"] for r in g)
            if len(entered) > 1:
                spacing.append((entered[-1] - entered[0]) / (len(entered) - 1))
        print(
            f"  {len(groups)} waves; entries {quantiles(spacing)} ms apart (p10/p50/p90 of waves)"
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Probe (``--direct``, ``--gateway``) or analyse (``--analyse``, ``--marks``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--direct")
    parser.add_argument("--gateway")
    parser.add_argument("--model")
    parser.add_argument("--prompts", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--n", type=int, default=48, help="requests a wave")
    parser.add_argument("--waves", type=int, default=10, help="recorded waves a round")
    parser.add_argument("--gap", type=float, default=0.05, help="seconds between waves")
    parser.add_argument("--analyse", type=Path)
    parser.add_argument("--marks", type=Path)
    args = parser.parse_args(argv)
    if args.analyse:
        if not args.marks:
            parser.error("--analyse needs --marks (the bench.wave_marks gateway's file)")
        analyse(json.loads(args.analyse.read_text()), json.loads(args.marks.read_text()))
        return 0
    if not all((args.direct, args.gateway, args.model, args.prompts, args.out)):
        parser.error("--direct, --gateway, --model, --prompts and --out are needed to probe")
    asyncio.run(probe(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
