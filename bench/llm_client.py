"""A bounded streaming client for real OpenAI-compatible servers (vLLM or specgate).

:func:`run_items` sends a list of streamed requests at a fixed concurrency and records, per
request, the time to the first token (first event with text), the end-to-end time, the
output tokens (from ``usage``), and the ``x-specgate-backend`` header when a gateway answered.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp

from bench.workloads import Item


@dataclass
class Outcome:
    """One request's result; times in seconds, ``error`` set when it failed."""

    task: str
    id: str
    ttft_s: float | None = None
    e2e_s: float | None = None
    output_tokens: int = 0
    chunks: int = 0
    backend: str | None = None
    error: str | None = None

    @property
    def itl_s(self) -> float | None:
        """Mean inter-token latency after the first token: (e2e - ttft) / (tokens - 1)."""
        if self.ttft_s is None or self.e2e_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    def to_json(self) -> dict[str, Any]:
        """A plain dict for the raw results (with ``itl_s``)."""
        return asdict(self) | {"itl_s": self.itl_s}


def _event_text(event: dict[str, Any]) -> str:
    for choice in event.get("choices") or []:
        text = choice.get("text") or (choice.get("delta") or {}).get("content")
        if text:
            return str(text)
    return ""


async def _one(
    session: aiohttp.ClientSession, base_url: str, model: str, item: Item, max_tokens: int
) -> Outcome:
    out = Outcome(item.task, item.id)
    started = time.perf_counter()
    try:
        async with session.post(base_url + item.path, json=item.request(model, max_tokens)) as r:
            out.backend = r.headers.get("x-specgate-backend")
            if r.status != 200:
                out.error = f"HTTP {r.status}: {(await r.text())[:200]}"
                return out
            async for raw in r.content:
                line = raw.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    out.error = str(event["error"])[:200]
                    return out
                if _event_text(event):
                    out.chunks += 1
                    if out.ttft_s is None:
                        out.ttft_s = time.perf_counter() - started
                usage = event.get("usage")
                if usage:
                    out.output_tokens = int(usage.get("completion_tokens") or 0)
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"[:200]
        return out
    out.e2e_s = time.perf_counter() - started
    return out


async def _run(
    base_url: str,
    model: str,
    items: Sequence[Item],
    concurrency: int,
    max_tokens: int,
    on_done: Callable[[Outcome], None] | None,
) -> list[Outcome]:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(items)):
        queue.put_nowait(i)
    results: list[Outcome | None] = [None] * len(items)
    timeout = aiohttp.ClientTimeout(total=600, sock_read=300)
    # one connection per worker: aiohttp's default pool (100 connections a session) kept
    # requests past the 100th waiting in this client, counted in their time to first token
    # (every target over one URL at c > 100: specgate in bench.sim_fleet, session 14)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                results[i] = await _one(session, base_url, model, items[i], max_tokens)
                if on_done is not None:
                    on_done(results[i])  # type: ignore[arg-type]

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return [r for r in results if r is not None]


def run_items(
    base_url: str,
    model: str,
    items: Sequence[Item],
    *,
    concurrency: int,
    max_tokens: int,
    on_done: Callable[[Outcome], None] | None = None,
) -> tuple[list[Outcome], float]:
    """Send every item (streamed) with ``concurrency`` in flight; returns the outcomes in
    item order and the wall time in seconds. ``on_done`` hears of each finished request."""
    return run_spread(
        [base_url], model, items, concurrency=concurrency, max_tokens=max_tokens, on_done=on_done
    )


def run_spread(
    base_urls: Sequence[str],
    model: str,
    items: Sequence[Item],
    *,
    concurrency: int,
    max_tokens: int,
    on_done: Callable[[Outcome], None] | None = None,
) -> tuple[list[Outcome], float]:
    """:func:`run_items` over several servers: item i goes to ``base_urls[i % n]``, each
    server with its share of ``concurrency`` (rounded up) in flight, as a client-side round
    robin would (e.g. every plain server of a fleet). Returns outcomes in item order and
    the wall time in seconds."""
    n = len(base_urls)
    per = max(1, -(-concurrency // n))

    async def run() -> list[Outcome]:
        parts = await asyncio.gather(
            *(
                _run(u, model, items[i::n], per, max_tokens, on_done)
                for i, u in enumerate(base_urls)
            )
        )
        ordered: list[Outcome] = [None] * len(items)  # type: ignore[list-item]
        for i, part in enumerate(parts):
            ordered[i::n] = part
        return ordered

    started = time.perf_counter()
    outcomes = asyncio.run(run())
    return outcomes, time.perf_counter() - started
