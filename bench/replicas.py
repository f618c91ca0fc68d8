"""Replicas sharing state through Redis (issue #28): how fast the fleet stops routing to a slow
backend, and what a Redis outage under load costs.

    python -m bench.replicas [--out bench/out/replicas] [--duration 20] [--outage 30]

Three gateway replicas (real uvicorn servers, ``tests/fakes/fleet.py``) share a real
``redis-server`` (ephemeral port, no persistence) in front of the local config's fake
backends; ``ngram`` answers after 0.3 s (about 40 tokens/s), the others at once.

* ``convergence``: 24 clients send code requests round-robin over the replicas for
  ``--duration`` s, once with ``state.backend: redis`` and once embedded (each replica alone).
  ``t_learn`` is when the first ngram answer finished (a replica learnt it); the figure is the
  share of requests routed to ngram among those started from ``t_learn + 5 s`` on, against
  ``routing.probe_share`` (0.05), plus the share per second.
* ``outage``: 200 concurrent clients for ``--outage + 10`` s; Redis is killed 5 s in and
  started again (empty) ``--outage`` s later. Counted: requests, failures (any status but 200
  or a transport error), and whether every replica's state converged after Redis returned.

Writes ``results.json`` to ``--out`` and prints it. Figures are reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from contracts.config import GatewayConfig, load_config
from tests.fakes.fleet import Fleet, RedisProcess, redis_config, running_fleet, running_redis

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m-instruct"
CODE = {"model": MODEL, "prompt": "def f(x):", "max_tokens": 16, "temperature": 0}
TASK = {"x-task-type": "code"}
SLOW = "ngram"


@contextlib.contextmanager
def fleet_of(config: GatewayConfig) -> Iterator[Fleet]:
    """Three replicas of ``config``, ngram slow, every fake answering 12 tokens."""
    with running_fleet(config) as fleet:
        for fake in fleet.fakes.values():
            fake.tokens = 12
        fleet.fakes[SLOW].first_delay_s = 0.3
        yield fleet


async def drive(
    fleet: Fleet, clients: int, seconds: float, during: Any = None
) -> list[dict[str, Any]]:
    """``clients`` loops sending code requests round-robin for ``seconds``; every request's
    start/end (seconds from the start), replica, status and backend."""
    rows: list[dict[str, Any]] = []
    start = time.monotonic()
    counter = iter(range(10**9))
    # a fresh connection per request: with reused ones about 1 request in 2,000 got a
    # ReadError here, the gateway logging a 499: httpcore's pool, shared by the replicas, can
    # close a kept-alive connection already handed to a request (encode/httpcore#1110;
    # python -m bench.keepalive shows it against plain uvicorn servers too)
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:

        async def loop() -> None:
            while time.monotonic() - start < seconds:
                i = next(counter)
                url = fleet.urls[i % len(fleet.urls)]
                t0 = time.monotonic() - start
                try:
                    r = await client.post(f"{url}/v1/completions", json=CODE, headers=TASK)
                    status, backend = r.status_code, r.headers.get("x-specgate-backend")
                    if status != 200:
                        backend = f"{backend} {r.text[:200]}"
                except httpx.TransportError as exc:
                    status, backend = 0, type(exc).__name__
                rows.append(
                    {"start": t0, "end": time.monotonic() - start, "replica": i % 3,
                     "status": status, "backend": backend}
                )  # fmt: skip

        tasks = [loop() for _ in range(clients)]
        if during is not None:
            tasks.append(during(start))
        await asyncio.gather(*tasks)
    return rows


def shares(rows: list[dict[str, Any]], probe_share: float) -> dict[str, Any]:
    """The convergence figures of one run (module docstring)."""
    slow_ends = [r["end"] for r in rows if r["backend"] == SLOW]
    if not slow_ends:
        return {"t_learn_s": None}
    t_learn = min(slow_ends)
    after = [r for r in rows if r["start"] >= t_learn + 5.0]
    share = sum(r["backend"] == SLOW for r in after) / len(after) if after else None
    per_s: dict[int, list[int]] = {}
    for r in rows:
        per_s.setdefault(int(r["start"]), []).append(r["backend"] == SLOW)
    return {
        "t_learn_s": round(t_learn, 2),
        "requests": len(rows),
        "requests_after_learn_plus_5s": len(after),
        "slow_share_after_learn_plus_5s": None if share is None else round(share, 4),
        "probe_share": probe_share,
        "within_probe_share": share is not None and share <= probe_share,
        "slow_requests_total": sum(r["backend"] == SLOW for r in rows),
        "slow_share_per_second": {s: round(sum(v) / len(v), 3) for s, v in sorted(per_s.items())},
    }


async def convergence(base: GatewayConfig, url: str, seconds: float) -> dict[str, Any]:
    out = {}
    for name, config in (("redis", redis_config(base, url)), ("embedded", base)):
        with fleet_of(config) as fleet:
            rows = await drive(fleet, clients=24, seconds=seconds)
        out[name] = shares(rows, base.routing.probe_share)
    return out


async def outage(base: GatewayConfig, server: RedisProcess, seconds: float) -> dict[str, Any]:
    events: dict[str, float] = {}
    with fleet_of(redis_config(base, server.url)) as fleet:

        async def kill_and_restore(start: float) -> None:
            await asyncio.sleep(5.0)
            server.kill()
            events["killed_s"] = time.monotonic() - start
            await asyncio.sleep(seconds)
            await asyncio.to_thread(server.start)
            events["back_s"] = time.monotonic() - start

        rows = await drive(fleet, clients=200, seconds=seconds + 10, during=kill_and_restore)
        await asyncio.sleep(3.0)
        async with httpx.AsyncClient(timeout=10) as client:
            states = [(await client.get(f"{u}/routes")).json() for u in fleet.urls]
    own = [s["adaptive"]["observations"] for s in states]
    converged = all(
        s["state"]["up"] and s["state"]["peer_observations"] == sum(own) - mine
        for s, mine in zip(states, own, strict=True)
    )
    down = [r for r in rows if events["killed_s"] <= r["start"] < events["back_s"]]
    return {
        "concurrency": 200,
        "redis_down_s": round(events["back_s"] - events["killed_s"], 1),
        "requests": len(rows),
        "requests_started_while_down": len(down),
        "failed": sum(r["status"] != 200 for r in rows),
        "failures": dict(
            Counter(f"{r['status']} {r['backend']}" for r in rows if r["status"] != 200)
        ),
        "failed_requests": [r for r in rows if r["status"] != 200][:10],
        "killed_s": round(events["killed_s"], 2),
        "converged_after_return": converged,
        "failed_syncs": [s["state"]["failures"] for s in states],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replicas")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "replicas")
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--outage", type=float, default=30.0)
    parser.add_argument("--only", choices=["convergence", "outage"])
    args = parser.parse_args(argv)
    base = load_config(ROOT / "config" / "local.yaml")
    results = {}
    with running_redis() as server:
        if args.only in (None, "convergence"):
            results["convergence"] = asyncio.run(convergence(base, server.url, args.duration))
        if args.only in (None, "outage"):
            results["outage"] = asyncio.run(outage(base, server, args.outage))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
