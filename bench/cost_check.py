"""specgate's CPU per request as a multiple of the bare proxy's, measured in one run.

    python -m bench.cost_check [--requests 600] [--repeats 3] [--concurrency 4]

Starts the fake upstream (:mod:`bench.fake_upstream`), the bare proxy
(:mod:`bench.bare_proxy`: uvicorn and aiohttp with no routing, the cheapest gateway on
specgate's stack) and ``specgate serve`` with the overhead benchmark's config
(:func:`bench.targets.specgate_config`: three backends, classifier, adaptive policy,
metrics, access log), then sends the overhead benchmark's chat completion (JSON, not
streamed) through each, ``repeats`` times in turn. A server's cost is the user+system CPU
time of its process (all threads, ``/proc``) over ``requests`` requests; per target the cheapest
repeat counts (a busy machine only ever adds time). The ratio of the two is what the unit
suite checks (``tests/unit/test_hot_path_cost.py``): both servers run on the same machine
at the same moment, so a loaded machine moves both, and the ratio moves only with
specgate's own work.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import yaml

from bench.procs import Server, free_port
from bench.targets import PATH, request_body, specgate_config


@dataclass(frozen=True)
class Cost:
    """One run's figures: CPU milliseconds per request (cheapest repeat) of specgate and
    of the bare proxy, and every repeat's figures."""

    specgate_ms: float
    bare_ms: float
    repeats: tuple[tuple[float, float], ...]

    @property
    def ratio(self) -> float:
        """specgate's CPU per request over the bare proxy's."""
        return self.specgate_ms / self.bare_ms


async def _send(url: str, body: bytes, requests: int, concurrency: int) -> int:
    """Send ``requests`` POSTs of ``body`` to ``url`` over ``concurrency`` keep-alive
    connections; returns how many answered 200."""
    left, ok = requests, 0
    headers = {"content-type": "application/json"}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            nonlocal left, ok
            while left > 0:
                left -= 1
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    ok += response.status == 200

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return ok


def cpu_ns(pid: int) -> int:
    """Nanoseconds on a CPU of every thread of process ``pid`` (``/proc/PID/task/*/schedstat``:
    nanosecond resolution, where ``/proc/PID/stat`` counts 10 ms ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            total += int((task / "schedstat").read_text().split()[0])
    return total


def cpu_ms_per_request(server: Server, url: str, requests: int, concurrency: int) -> float:
    """CPU milliseconds per request of ``server``'s process (all its threads) over
    ``requests`` requests (raises RuntimeError when any was not answered 200)."""
    before = cpu_ns(server.pid)
    ok = asyncio.run(_send(url, request_body(False), requests, concurrency))
    used = (cpu_ns(server.pid) - before) / 1e9
    if ok != requests:
        raise RuntimeError(f"{server.name}: {requests - ok} of {requests} not answered 200")
    return used * 1000 / requests


def measure(
    *, requests: int = 600, repeats: int = 3, concurrency: int = 4, logs: Path | None = None
) -> Cost:
    """Start the three servers, warm both gateways up, then measure ``repeats`` times in
    turn (see the module docstring). Every server is stopped on the way out."""
    with tempfile.TemporaryDirectory(prefix="specgate-cost-") as tmp:
        work = logs or Path(tmp)
        ports = [free_port() for _ in range(3)]
        upstreams = [f"http://127.0.0.1:{p}" for p in ports]
        config = Path(tmp) / "specgate.yaml"
        config.write_text(yaml.safe_dump(specgate_config(upstreams), sort_keys=False))
        fake_argv = [sys.executable, "-m", "bench.fake_upstream"]
        fake_argv += [arg for p in ports for arg in ("--port", str(p))]
        bare_port, gate_port = free_port(), free_port()
        bare_argv = [sys.executable, "-m", "bench.bare_proxy", "--upstream", upstreams[0]]
        gate_argv = [sys.executable, "-m", "cli", "serve", "--config", str(config)]
        state = {"SPECGATE_STATE_FILE": str(Path(tmp) / "state.json")}
        fake = Server(
            "fake", fake_argv, ready_url=upstreams[0] + "/health", log_path=work / "fake.log"
        )
        bare_url, gate_url = f"http://127.0.0.1:{bare_port}", f"http://127.0.0.1:{gate_port}"
        bare = Server(
            "bare-proxy",
            [*bare_argv, "--port", str(bare_port)],
            ready_url=bare_url + "/health",
            log_path=work / "bare.log",
        )
        gate = Server(
            "specgate",
            [*gate_argv, "--port", str(gate_port)],
            ready_url=gate_url + "/ready",
            log_path=work / "specgate.log",
            env=state,
        )
        with fake, bare, gate:
            targets = ((gate, gate_url + PATH), (bare, bare_url + PATH))
            for server, url in targets:  # warm-up: connections, caches, first allocations
                cpu_ms_per_request(server, url, max(requests // 4, 50), concurrency)
            runs = []
            for _ in range(repeats):
                gate_ms, bare_ms = (
                    cpu_ms_per_request(server, url, requests, concurrency)
                    for server, url in targets
                )
                runs.append((gate_ms, bare_ms))
    return Cost(min(g for g, _ in runs), min(b for _, b in runs), tuple(runs))


def main(argv: Sequence[str] | None = None) -> int:
    """Print one run's figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args(argv)
    cost = measure(requests=args.requests, repeats=args.repeats, concurrency=args.concurrency)
    for gate_ms, bare_ms in cost.repeats:
        print(f"specgate {gate_ms:.3f} ms  bare proxy {bare_ms:.3f} ms  ({gate_ms / bare_ms:.2f}x)")
    print(
        f"cheapest: specgate {cost.specgate_ms:.3f} ms, bare proxy {cost.bare_ms:.3f} ms "
        f"CPU per request: {cost.ratio:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
