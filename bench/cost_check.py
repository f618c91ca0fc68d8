"""specgate's CPU per request as a multiple of the bare proxy's, measured in one run.

    python -m bench.cost_check [--requests 300] [--repeats 8] [--concurrency 4]
                               [--base /path/to/other/checkout] [--stream]

Starts the fake upstream (:mod:`bench.fake_upstream`), the bare proxy
(:mod:`bench.bare_proxy`: uvicorn and aiohttp with no routing, the cheapest gateway on
specgate's stack) and ``specgate serve`` with the overhead benchmark's config
(:func:`bench.targets.specgate_config`: three backends, classifier, adaptive policy,
metrics, access log), then sends the overhead benchmark's chat completion (JSON; with
``--stream``, streamed: 64 events) through both gateways at once, each client connection
alternating between them, ``repeats`` times. A server's cost is the CPU time of its process
(all threads, ``/proc/PID/task/*/schedstat``) over the repeat, per request. Both gateways
run in the same moments, so a machine loaded by other work slows both alike, and the median
of the repeats' ratios moves only with specgate's own work: measured on a 2-core machine
shared with other jobs (load average 4-10), three runs gave 2.63x, 2.68x and 2.80x, where
the same servers measured one after the other gave 3.2x to 5.8x. The unit suite checks it
(``tests/unit/test_hot_path_cost.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
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
    """One run's figures: per repeat, CPU milliseconds per request of specgate, of the
    bare proxy and (when measured) of another checkout's specgate, over the same moments."""

    repeats: tuple[tuple[float, ...], ...]

    @property
    def ratio(self) -> float:
        """specgate's CPU per request over the bare proxy's: the median of the repeats'
        ratios (each repeat's figures share the machine's state of that moment)."""
        return statistics.median(r[0] / r[1] for r in self.repeats)

    @property
    def base_ratio(self) -> float | None:
        """The other checkout's specgate over the bare proxy, likewise (None: not run)."""
        if len(self.repeats[0]) < 3:
            return None
        return statistics.median(r[2] / r[1] for r in self.repeats)


async def _send(urls: Sequence[str], body: bytes, requests: int, concurrency: int) -> int:
    """Send ``requests`` POSTs of ``body`` to each of ``urls`` over ``concurrency`` keep-alive
    connections per URL, each worker alternating between the URLs (so the servers work in
    the same moments); returns how many answered 200."""
    left, ok = requests, 0
    headers = {"content-type": "application/json"}
    connector = aiohttp.TCPConnector(limit=concurrency * len(urls))
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            nonlocal left, ok
            while left > 0:
                left -= 1
                for url in urls:
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


def cpu_ms_per_request(
    servers: Sequence[Server],
    urls: Sequence[str],
    requests: int,
    concurrency: int,
    stream: bool = False,
) -> list[float]:
    """CPU milliseconds per request of each of ``servers`` (its process, all threads) over
    ``requests`` requests to each (``stream``: streamed ones), sent to all of them together
    (see :func:`_send`); raises RuntimeError when any was not answered 200."""
    before = [cpu_ns(s.pid) for s in servers]
    ok = asyncio.run(_send(urls, request_body(stream), requests, concurrency))
    used = [(cpu_ns(s.pid) - b) / 1e9 for s, b in zip(servers, before, strict=True)]
    if ok != requests * len(urls):
        raise RuntimeError(f"{requests * len(urls) - ok} requests not answered 200")
    return [u * 1000 / requests for u in used]


def measure(
    *,
    requests: int = 300,
    repeats: int = 8,
    concurrency: int = 4,
    logs: Path | None = None,
    base: Path | None = None,
    stream: bool = False,
) -> Cost:
    """Start the three servers, warm both gateways up, then measure ``repeats`` times (see
    the module docstring); ``logs``: where the servers' logs go (default: a temporary
    folder); ``base``: another checkout (e.g. ``git archive BASE | tar -x -C DIR``) whose
    specgate is loaded in the same moments too (an A/B of two commits); ``stream``: streamed
    requests. Every server is stopped on the way out."""
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
        servers, urls = [gate, bare], [gate_url + PATH, bare_url + PATH]
        if base is not None:
            base_port = free_port()
            env = state | {"PYTHONPATH": str(base), "PYTHONSAFEPATH": "1"}
            env["SPECGATE_STATE_FILE"] = str(Path(tmp) / "base-state.json")
            base_url = f"http://127.0.0.1:{base_port}"
            servers.append(
                Server(
                    "specgate-base",
                    [*gate_argv, "--port", str(base_port)],
                    ready_url=base_url + "/ready",
                    log_path=work / "specgate-base.log",
                    env=env,
                )
            )
            urls.append(base_url + PATH)
        with contextlib.ExitStack() as running:
            for server in (fake, *servers):
                running.enter_context(server)
            warm_up = max(requests // 4, 50)
            cpu_ms_per_request(servers, urls, warm_up, concurrency, stream)
            runs = [
                tuple(cpu_ms_per_request(servers, urls, requests, concurrency, stream))
                for _ in range(repeats)
            ]
    return Cost(tuple(runs))


def main(argv: Sequence[str] | None = None) -> int:
    """Print one run's figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--base", type=Path, help="another checkout, measured alongside")
    parser.add_argument("--stream", action="store_true", help="streamed requests (64 events)")
    args = parser.parse_args(argv)
    cost = measure(
        requests=args.requests,
        repeats=args.repeats,
        concurrency=args.concurrency,
        base=args.base,
        stream=args.stream,
    )
    for gate_ms, bare_ms, *base_ms in cost.repeats:
        line = f"specgate {gate_ms:.3f} ms  bare proxy {bare_ms:.3f} ms  ({gate_ms / bare_ms:.2f}x)"
        if base_ms:
            line += f"  base {base_ms[0]:.3f} ms ({base_ms[0] / bare_ms:.2f}x)"
        print(line)
    print(f"median ratio: {cost.ratio:.2f}x")
    if cost.base_ratio is not None:
        print(f"base median ratio: {cost.base_ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
