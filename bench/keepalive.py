"""Lost requests on kept-alive connections: the gateway beside plain uvicorn (issue 26).

    python -m bench.keepalive [--requests 4000] [--concurrency 200] [--repeats 2]

Three servers on real sockets in this process (each its own uvicorn event loop in a thread,
as ``tests/fakes/fleet.py`` runs them): either three gateway replicas in front of the fake
backends (``gateway``), or three of those fake vLLM backends themselves, plain FastAPI on
uvicorn (``uvicorn``, the reference). One ``httpx.AsyncClient`` sends ``--requests`` code
completions (every second one streamed) round-robin over the three, ``--concurrency`` at a
time, with its pool either capped at the concurrency and kept alive (``capped``: what
``httpx.Limits(max_connections=N)`` gives) or opening a fresh connection per request
(``fresh``). Prints the answers and transport errors per target and pool; errors are
reported, never asserted.

What it shows (docs/benchmarks.md, "Keep-alive"): the ``ReadError`` seen under this load is
httpcore's pool closing a kept-alive connection already handed to a queued request
(encode/httpcore#1110): the server sees the request's head and then the client's close (the
gateway logs a 499), whichever server it is.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence

import httpx

from tests.fakes.fake_vllm import FakeBehaviour, create_fake_vllm
from tests.fakes.fleet import running_fleet
from tests.fakes.servers import running_server
from tests.unit.conftest import MODEL, local_config

CODE = {"model": MODEL, "prompt": "def f(x):", "max_tokens": 16, "temperature": 0}
POOLS = {
    "capped": lambda n: httpx.Limits(max_connections=n, max_keepalive_connections=n),
    "fresh": lambda n: httpx.Limits(max_connections=n, max_keepalive_connections=0),
}


@contextlib.contextmanager
def servers(target: str) -> Iterator[list[str]]:
    """Three base URLs: gateway replicas (``gateway``) or fake vLLM backends (``uvicorn``),
    each answering 12 tokens; keep-alive 120 s, past the run."""
    if target == "gateway":
        with running_fleet(local_config()) as fleet:
            for fake in fleet.fakes.values():
                fake.tokens = 12
            yield fleet.urls
        return
    with contextlib.ExitStack() as stack:
        apps = [create_fake_vllm(FakeBehaviour(name=f"u{i}", tokens=12)) for i in range(3)]
        yield [stack.enter_context(running_server(a, timeout_keep_alive=120)) for a in apps]


async def drive(urls: Sequence[str], requests: int, concurrency: int, pool: str) -> Counter[str]:
    """Answers by status, transport errors by type."""
    counts: Counter[str] = Counter()
    limits = POOLS[pool](concurrency)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        gate = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with gate:
                body = CODE | {"stream": i % 2 == 0}
                try:
                    url = f"{urls[i % len(urls)]}/v1/completions"
                    r = await client.post(url, json=body, headers={"x-task-type": "code"})
                    counts[str(r.status_code)] += 1
                except httpx.TransportError as exc:
                    counts[type(exc).__name__] += 1

        await asyncio.gather(*(one(i) for i in range(requests)))
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--targets", default="uvicorn,gateway")
    parser.add_argument("--pools", default="capped,fresh")
    args = parser.parse_args(argv)
    print("| target | pool | run | answers | errors | seconds |")
    print("| --- | --- | --- | --- | --- | --- |")
    for repeat in range(args.repeats):
        for target in args.targets.split(","):
            for pool in args.pools.split(","):
                started = time.perf_counter()
                with servers(target) as urls:
                    counts = asyncio.run(drive(urls, args.requests, args.concurrency, pool))
                errors = {k: v for k, v in counts.items() if not k.isdigit()}
                answers = {k: v for k, v in counts.items() if k.isdigit()}
                print(f"| {target} | {pool} | {repeat + 1} | {answers} | {errors or 0} | "
                      f"{time.perf_counter() - started:.0f} |", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
