"""Load generators: ``wrk`` for non-streamed requests, a bounded aiohttp client for streams.

Both send one fixed request body for a fixed time to ``127.0.0.1`` only and return a
:class:`LoadResult`. ``wrk`` (Debian package ``wrk``) is a C load generator, so the client
side costs little; streams use Python (aiohttp, on uvloop when installed) because the time
to the first chunk is measured per request.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

#: Sent as ``Authorization: Bearer`` to every target (the LiteLLM proxy requires a key;
#: specgate drops the client's key, vllm-router passes it on).
API_KEY = "sk-specgate-bench"

_WRK_LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer {key}"
wrk.body = {body}
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\\nWRK_JSON {{"requests": %d, "duration_us": %d, "p50_us": %d, "p90_us": %d, '
    .. '"p99_us": %d, "errors": %d, "status_errors": %d}}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), e.connect + e.read + e.write + e.timeout, e.status))
end
"""


@dataclass
class LoadResult:
    """One load run against one target: counts, latency percentiles (ms), throughput."""

    requests: int
    errors: int
    duration_s: float
    p50_ms: float
    p99_ms: float
    rps: float
    ttfc_p50_ms: float | None = None
    ttfc_p99_ms: float | None = None
    events_per_stream: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """A plain dict for the raw results file."""
        return asdict(self)


def wrk_path() -> str:
    """The ``wrk`` executable; raises with the install hint when it is missing."""
    path = shutil.which("wrk")
    if path is None:
        raise RuntimeError("wrk not found: install it with `apt-get install -y wrk`")
    return path


def run_wrk(url: str, body: bytes, *, concurrency: int, duration_s: float) -> LoadResult:
    """POST ``body`` to ``url`` from ``concurrency`` keep-alive connections (one wrk thread)
    for ``duration_s`` seconds."""
    lua = _WRK_LUA.format(body=json.dumps(body.decode()), key=API_KEY)
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(lua)
        script = Path(f.name)
    try:
        argv = [wrk_path(), "-t1", f"-c{concurrency}", f"-d{duration_s:g}s", "--timeout", "10s"]
        out = subprocess.run(
            [*argv, "-s", str(script), url],
            capture_output=True,
            text=True,
            timeout=duration_s + 30,
            check=True,
        ).stdout
    finally:
        script.unlink(missing_ok=True)
    line = next(ln for ln in out.splitlines() if ln.startswith("WRK_JSON "))
    data = json.loads(line.removeprefix("WRK_JSON "))
    duration = data["duration_us"] / 1e6
    return LoadResult(
        requests=data["requests"],
        errors=data["errors"] + data["status_errors"],
        duration_s=duration,
        p50_ms=data["p50_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        rps=data["requests"] / duration,
        extra={"p90_ms": data["p90_us"] / 1000},
    )


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation; nan for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@dataclass
class _Samples:
    ttfc: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    events: list[int] = field(default_factory=list)
    errors: int = 0


async def _stream_worker(
    session: aiohttp.ClientSession, url: str, body: bytes, stop_at: float, s: _Samples
) -> None:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"}
    while time.perf_counter() < stop_at:
        started = time.perf_counter()
        first: float | None = None
        events = 0
        try:
            async with session.post(url, data=body, headers=headers) as resp:
                async for chunk in resp.content.iter_any():
                    if first is None:
                        first = time.perf_counter()
                    events += chunk.count(b"data: ")
                ok = resp.status == 200 and events > 0
        except aiohttp.ClientError:
            ok = False
        if not ok or first is None:
            s.errors += 1
            continue
        s.ttfc.append(first - started)
        s.total.append(time.perf_counter() - started)
        s.events.append(events)


async def _stream_load(url: str, body: bytes, concurrency: int, duration_s: float) -> LoadResult:
    samples = _Samples()
    timeout = aiohttp.ClientTimeout(total=30)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = time.perf_counter()
        stop_at = started + duration_s
        workers = [_stream_worker(session, url, body, stop_at, samples) for _ in range(concurrency)]
        await asyncio.gather(*workers)
        elapsed = time.perf_counter() - started
    n = len(samples.total)
    return LoadResult(
        requests=n,
        errors=samples.errors,
        duration_s=elapsed,
        p50_ms=percentile(samples.total, 50) * 1000,
        p99_ms=percentile(samples.total, 99) * 1000,
        rps=n / elapsed,
        ttfc_p50_ms=percentile(samples.ttfc, 50) * 1000,
        ttfc_p99_ms=percentile(samples.ttfc, 99) * 1000,
        events_per_stream=sum(samples.events) / n if n else None,
    )


def run_streams(url: str, body: bytes, *, concurrency: int, duration_s: float) -> LoadResult:
    """Stream ``body`` to ``url`` from ``concurrency`` workers for ``duration_s`` seconds
    (requests already started finish); per request the time to the first body chunk and
    to the end of the stream."""
    coro = _stream_load(url, body, concurrency, duration_s)
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)
