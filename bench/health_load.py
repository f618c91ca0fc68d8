"""The gateway's own ``/health`` and ``/ready`` under load (issue 26, item 1).

    python -m bench.health_load [--concurrency 400] [--duration 20] [--token-delay-ms 20]
                                [--out bench/out/health-load]

A fake vLLM upstream (:mod:`bench.fake_upstream`, three ports, 64-token answers with
``--token-delay-ms`` between stream events, so streams last as real ones do) behind
``specgate serve`` (:func:`bench.targets.specgate_target`); ``--concurrency`` clients send
mixed requests (chat and completions, streamed and not, code and chat prompts) in a loop for
``--duration`` seconds while a prober asks ``/health`` and ``/ready`` every
``--probe-interval-ms`` on a new connection each time (as a Kubernetes or load-balancer
probe does), the same two on the gateway's probe port (``SPECGATE_HEALTH_PORT``, answered
by a thread of its own: :mod:`gateway.probe_port`), and beside them ``/health`` of a bare
uvicorn app under no load (the
reference: what the machine and the prober give any server at the gateway's CPU and
niceness). With 2+ CPUs the gateway is pinned to the last CPU, the fake and the clients to
the others; the fake and the clients run at the niceness ``specgate up`` gives its backends
(:data:`backends.launcher.BACKEND_NICENESS`), the gateway at the default. Reports each probe
path's latency percentiles and the load's throughput to ``results.json`` and
``health-load.md`` in ``--out``; timings are reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from backends.launcher import BACKEND_NICENESS
from bench.fake_upstream import MODEL
from bench.load import API_KEY, percentile
from bench.overhead import cpu_sets
from bench.procs import Server, free_port, interrupt_on_sigterm, load_average, machine
from bench.targets import specgate_target

#: What the prober asks, by label: the gateway's own probe endpoints, and the reference, a
#: bare uvicorn app's ``/health`` (:func:`bare_app`) on the gateway's CPU at its niceness but
#: under no load: the floor that this machine and the prober give any server. ``port /...``:
#: the gateway's probe port (``SPECGATE_HEALTH_PORT``, a thread of its own).
PROBED = ("/health", "/ready", "port /health", "port /ready", "bare /health")
#: Mixed requests: (path, body) in turn per client.
MIX: list[tuple[str, dict[str, Any]]] = [
    (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "Hello! How are you?"}],
            "temperature": 0.5,
            "stream": True,
        },
    ),  # fmt: skip
    (
        "/v1/completions",
        {"prompt": "def merge_intervals(intervals):", "temperature": 0, "max_tokens": 64},
    ),  # fmt: skip
    (
        "/v1/chat/completions",
        {
            "messages": [
                {
                    "role": "user",
                    "content": (
                        "Write a Python function that reverses a linked list, with type hints."
                    ),
                }
            ],
            "temperature": 0.2,
            "stream": True,
        },
    ),  # fmt: skip
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Tell me a story."}], "temperature": 1.0},
    ),  # fmt: skip
]


async def _client(
    session: aiohttp.ClientSession, base: str, offset: int, stop_at: float, counts: dict[str, int]
) -> None:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"}
    i = offset
    while time.perf_counter() < stop_at:
        path, body = MIX[i % len(MIX)]
        i += 1
        try:
            async with session.post(
                base + path, data=json.dumps({"model": MODEL, **body}), headers=headers
            ) as resp:
                async for _ in resp.content.iter_any():
                    pass
                key = "ok" if resp.status == 200 else f"status {resp.status}"
                counts[key] = counts.get(key, 0) + 1
        except (TimeoutError, aiohttp.ClientError) as exc:
            key = type(exc).__name__
            counts[key] = counts.get(key, 0) + 1


def bare_app() -> Any:
    """The reference: an ASGI app answering ``GET /health`` 200 ``{"status":"ok"}`` and
    nothing else (``uvicorn --factory bench.health_load:bare_app``)."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b'{"status":"ok"}'
        headers = [(b"content-type", b"application/json"), (b"content-length", b"15")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


def probe(
    base: str, start_at: float, duration_s: float, interval_s: float, bare: str, port: str | None
) -> dict[str, Any]:
    """From ``start_at`` (``time.time()``) for ``duration_s`` seconds (``inf``: until SIGINT),
    ``GET /health`` then ``/ready`` of ``base`` and of ``port`` (the probe port; ``None``:
    not probed) and ``/health`` of ``bare`` every ``interval_s``, each on a new connection
    (as a Kubernetes or load-balancer probe does); per :data:`PROBED` label the latencies
    (seconds), when each probe started (``time.time()``) and the status (0: no answer). Run
    in a process of its own (:func:`start_prober`), so the clients' event loop does not
    delay it."""
    urls = (base, base, port, port, bare)
    paths = ("/health", "/ready", "/health", "/ready", "/health")
    targets = {label: (url, path) for label, url, path in zip(PROBED, urls, paths, strict=True)
               if url is not None}  # fmt: skip
    out: dict[str, Any] = {p: {"latency": [], "at": [], "status": []} for p in targets}
    time.sleep(max(0.0, start_at - time.time()))
    stop_at = time.perf_counter() + duration_s
    try:
        while time.perf_counter() < stop_at:
            _probe_round(targets, out)
            time.sleep(interval_s)
    except KeyboardInterrupt:  # the caller's way to stop an open-ended run
        pass
    return out


def _probe_round(targets: dict[str, tuple[str, str]], out: dict[str, Any]) -> None:
    """One ``GET`` per target, in turn, each on a new connection; appends to ``out``."""
    for label, (url, path) in targets.items():
        host, port = url.removeprefix("http://").split(":")
        at, started = time.time(), time.perf_counter()
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            response.read()
            status = response.status
        except OSError:
            status = 0
        finally:
            conn.close()
        out[label]["latency"].append(time.perf_counter() - started)
        out[label]["at"].append(at)
        out[label]["status"].append(status)


def start_prober(
    base: str, start_at: float, duration_s: float, interval_s: float, bare: str, port: str | None
) -> subprocess.Popen[str]:
    """:func:`probe` in a child process (at this process's priority when started); it prints
    the result as JSON when ``duration_s`` has passed or on SIGINT."""
    call = json.dumps([base, start_at, duration_s, interval_s, bare, port])
    code = "import json, sys; from bench.health_load import probe; "
    code += "print(json.dumps(probe(*json.loads(sys.argv[1]))))"
    return subprocess.Popen([sys.executable, "-c", code, call], stdout=subprocess.PIPE, text=True)


async def run(base: str, concurrency: int, duration_s: float) -> dict[str, Any]:
    """``concurrency`` mixed clients for ``duration_s`` seconds against ``base``; returns
    the answers by status (or error) and the answers per second."""
    counts: dict[str, int] = {"ok": 0}
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = time.perf_counter()
        stop_at = started + duration_s
        await asyncio.gather(
            *(_client(session, base, i, stop_at, counts) for i in range(concurrency))
        )
        elapsed = time.perf_counter() - started
    return {"requests": counts, "rps": counts["ok"] / elapsed}


def probe_figures(samples: dict[str, Any]) -> dict[str, Any]:
    """Per probed path: probes, answers other than 200 (how many, and how many of each
    status; 0: no answer), latency p50/p99/max (ms)."""
    out = {}
    for path, seen in samples.items():
        latency = seen["latency"]
        bad = Counter(status for status in seen["status"] if status != 200)
        out[path] = {
            "probes": len(latency),
            "not_200": bad.total(),
            "not_200_by_status": {str(k): v for k, v in sorted(bad.items())},
            "p50_ms": round(percentile(latency, 50) * 1000, 2),
            "p99_ms": round(percentile(latency, 99) * 1000, 2),
            "max_ms": round(max(latency, default=0.0) * 1000, 2),
        }
    return out


def probe_table(figures: dict[str, Any]) -> list[str]:
    """:func:`probe_figures` as Markdown table lines, one row per probed path."""
    lines = [
        "| path | probes | not 200 | p50 ms | p99 ms | max ms |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for path, f in figures.items():
        bad = f"{f['not_200']} {f['not_200_by_status']}" if f["not_200"] else "0"
        lines.append(f"| {path} | {f['probes']} | {bad} | {f['p50_ms']} | "
                     f"{f['p99_ms']} | {f['max_ms']} |")  # fmt: skip
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=400)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--token-delay-ms", type=float, default=20.0)
    parser.add_argument("--probe-interval-ms", type=float, default=50.0)
    parser.add_argument("--out", type=Path, default=Path("bench/out/health-load"))
    parser.add_argument("--no-pin", action="store_true")
    # e.g. -10 on a machine busy with other jobs at the default priority: the gateway then
    # stands to them as it stands to its backends under `specgate up` (0 against +10)
    parser.add_argument("--gateway-niceness", type=int, default=0)
    parser.add_argument("--env", action="append", default=[], help="K=V for the gateway")
    args = parser.parse_args(argv)
    interrupt_on_sigterm()
    args.out.mkdir(parents=True, exist_ok=True)
    gateway_cpus, other_cpus = cpu_sets(not args.no_pin)
    ports = [free_port() for _ in range(3)]
    fake_argv = [sys.executable, "-m", "bench.fake_upstream"]
    fake_argv += ["--token-delay-ms", str(args.token_delay_ms)]
    fake_argv += [a for p in ports for a in ("--port", str(p))]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        health_port = free_port()
        env = {"SPECGATE_LOG_LEVEL": "warning", "SPECGATE_HEALTH_PORT": str(health_port),
               **dict(e.split("=", 1) for e in args.env)}  # fmt: skip
        spec = specgate_target(free_port(), [f"http://127.0.0.1:{p}" for p in ports], work, env)
        # the fake stands for the backends, at the niceness `specgate up` gives them
        fake = Server("fake", fake_argv, ready_url=f"http://127.0.0.1:{ports[0]}/health",
                      log_path=work / "fake.log", cpus=other_cpus,
                      niceness=BACKEND_NICENESS)  # fmt: skip
        gateway = Server("specgate", spec.argv, ready_url=spec.url + spec.ready_path,
                         log_path=args.out / "specgate.log", env=spec.env,
                         cpus=gateway_cpus, niceness=args.gateway_niceness)  # fmt: skip
        bare_port = free_port()
        bare_argv = [sys.executable, "-m", "uvicorn", "--factory", "bench.health_load:bare_app"]
        bare_argv += ["--port", str(bare_port), "--loop", "uvloop", "--http", "httptools"]
        bare_url = f"http://127.0.0.1:{bare_port}"
        bare = Server("bare", bare_argv, ready_url=bare_url + "/health", log_path=work / "bare.log",
                      cpus=gateway_cpus, niceness=args.gateway_niceness)  # fmt: skip
        load_before = load_average()
        with fake, gateway, bare:
            asyncio.run(run(spec.url, 16, 2.0))  # warm-up
            start_at = time.time() + 1.0
            interval_s = args.probe_interval_ms / 1000
            port_url = f"http://127.0.0.1:{health_port}"
            prober = start_prober(spec.url, start_at, args.duration, interval_s, bare_url, port_url)
            os.nice(BACKEND_NICENESS)  # the clients, too, stand for other machines
            time.sleep(max(0.0, start_at - time.time()))
            cpu_before, wall_before = gateway.cpu_seconds(), time.perf_counter()
            figures = asyncio.run(run(spec.url, args.concurrency, args.duration))
            # the share of one CPU the gateway got: near 1.0 it was saturated by its own
            # work; well under it with slow probes, something else held it up
            figures["gateway_cpu_share"] = round(
                (gateway.cpu_seconds() - cpu_before) / (time.perf_counter() - wall_before), 2
            )
            stdout, _ = prober.communicate(timeout=args.duration + 60)
            probes = probe_figures(json.loads(stdout))
            figures |= probes
    meta = {
        "gateway_niceness": args.gateway_niceness,
        "concurrency": args.concurrency,
        "duration_s": args.duration,
        "token_delay_ms": args.token_delay_ms,
        "probe_interval_ms": args.probe_interval_ms,
        "load_average": [load_before, load_average()],
        "machine": machine(),
        "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    (args.out / "results.json").write_text(json.dumps({"meta": meta, **figures}, indent=2))
    lines = [
        f"concurrency {args.concurrency}, {args.duration:g} s, token delay "
        f"{args.token_delay_ms:g} ms, gateway niceness {args.gateway_niceness}, load average "
        f"{load_before:.1f} -> {load_average():.1f}",
        f"requests: {figures['requests']} ({figures['rps']:.0f}/s), gateway CPU share "
        f"{figures['gateway_cpu_share']}",
        "",
        *probe_table(probes),
    ]
    (args.out / "health-load.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
