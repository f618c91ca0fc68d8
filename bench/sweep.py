"""The reliability sweep on a running stack (issue 26's target): mixed load, a SIGKILL, a reload.

    flock /tmp/specgate-vllm.lock specgate up --config config/local.yaml &   # ~2 min to start
    python -m bench.sweep [--url http://127.0.0.1:8000] [--concurrency 400] [--requests 1200]
                          [--kill ngram] [--max-tokens 12] [--out bench/out/sweep]

``--requests`` requests, ``--concurrency`` at a time, cycle through every mix of the four
tasks (``x-task-type``), greedy and sampled (temperature 0 / 0.7), streamed and not, on the
routed paths (``/v1/chat/completions``, ``/v1/completions``) and relayed ones
(``/invocations``, ``/tokenize``). When a third have answered, the ``--kill`` backend's
server is SIGKILLed (its pid from ``/routes``: ``specgate up``'s supervisor restarts it);
when two thirds have, the config is reloaded (``POST /routes/reload``). Each answer is
classified:

* ``ok``: 200 with a complete body (JSON with ``choices``/``tokens``, or SSE ending in
  ``data: [DONE]`` with no error event);
* ``clean_error``: an OpenAI error envelope (any status), or a stream that ends in an
  ``error`` event then ``[DONE]``, by status and code;
* ``lost``: anything else (a transport error, a cut stream, a body that is neither).

Reported, never asserted: the three counts, every 503 (none should come while another backend
could serve: with ``ngram`` killed, plain serves sampled requests and three backends greedy
ones), the ``request_quarantined`` answers and the quarantine table after the run (no request
caused the death, so none should be quarantined), and the deaths the gateway counted.

Throughout the sweep, :func:`bench.health_load.probe` (a process of its own) asks the
gateway's ``/health`` and ``/ready`` every ``--probe-interval-ms``, each on a new connection,
the same two on the probe port when ``--health-port`` (default: ``SPECGATE_HEALTH_PORT``) is
set, and the reference, a bare uvicorn app's ``/health`` started here at the gateway's
niceness (0) under no load; per path p50/p99/max and every answer other than 200, beside the
gateway process's CPU share (its pid: the parent of the backends' servers on ``/routes``)
and the load average. Writes ``results.json``, ``sweep.md`` and ``probes.json`` (every probe:
when, how long, what answered) to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from bench.health_load import probe_figures, probe_table, start_prober
from bench.load import percentile
from bench.procs import CLOCK_TICKS, Server, free_port, load_average, machine

MODEL = "smollm2-135m-instruct"
PROMPTS = {
    "chat": "Hello! How are you today? Tell me about your weekend plans.",
    "code": "Write a Python function merge_intervals(intervals) that merges overlapping ones.",
    "rag": (
        "Context: The Eiffel Tower is 330 metres tall and was finished in 1889 for the World's "
        "Fair in Paris.\nQuestion: How tall is the Eiffel Tower and when was it finished?"
    ),
    "creative": "Write a short poem about the sea at night.",
}
ROUTED = ("/v1/chat/completions", "/v1/completions")
RELAYED = ("/invocations", "/tokenize")


def requests(max_tokens: int) -> list[tuple[str, dict[str, Any], dict[str, str], str]]:
    """Every mix once: (path, body, headers, label)."""
    out = []
    for task, temperature, stream, path in itertools.product(
        PROMPTS, (0.0, 0.7), (False, True), ROUTED + RELAYED
    ):
        if path in RELAYED and stream:
            continue  # relayed paths answer JSON here
        prompt = PROMPTS[task]
        body: dict[str, Any] = {"model": MODEL}
        if path == "/tokenize":
            body["prompt"] = prompt
        elif path == "/v1/completions":
            body |= {"prompt": prompt, "max_tokens": max_tokens, "temperature": temperature}
        else:  # chat, and /invocations with a chat body
            messages = [{"role": "user", "content": prompt}]
            body |= {"messages": messages, "max_tokens": max_tokens, "temperature": temperature}
        if stream:
            body["stream"] = True
        label = f"{path} {task} T={temperature:g}{' stream' if stream else ''}"
        out.append((path, body, {"x-task-type": task}, label))
    return out


def classify(status: int, body: bytes, stream: bool) -> tuple[str, str]:
    """(``ok`` | ``clean_error`` | ``lost``, detail) for one answer."""
    text = body.decode("utf-8", "replace")
    if stream and status == 200:
        events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
        if not events or events[-1] != "[DONE]":
            return "lost", "stream without [DONE]"
        errors = [e for e in events[:-1] if e.startswith('{"error"')]
        if errors:
            code = json.loads(errors[0])["error"].get("code")
            return "clean_error", f"stream error {code}"
        return "ok", ""
    try:
        data = json.loads(text)
    except ValueError:
        return "lost", f"{status} not JSON"
    if status == 200 and isinstance(data, dict) and ("choices" in data or "tokens" in data):
        return "ok", ""
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        return "clean_error", f"{status} {data['error'].get('code')}"
    return "lost", f"{status} {text[:80]}"


async def backend_pid(session: aiohttp.ClientSession, url: str, name: str) -> int | None:
    """The pid of ``name``'s server as ``specgate up``'s supervisor shows it on ``/routes``."""
    async with session.get(f"{url}/routes") as resp:
        routes = await resp.json()
    backend = next(b for b in routes["backends"] if b["name"] == name)
    return (backend.get("process") or {}).get("pid")


def _stat(pid: int) -> list[str]:
    """``/proc/PID/stat``'s fields from the 3rd (state) on; raises OSError when it is gone."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def gateway_pid(routes: dict[str, Any]) -> int | None:
    """The gateway's pid under ``specgate up``: the parent of the backends' servers
    (``/routes``); None when specgate did not launch them."""
    for backend in routes["backends"]:
        pid = (backend.get("process") or {}).get("pid")
        if pid is not None:
            try:
                return int(_stat(pid)[1])  # field 4: ppid
            except OSError:
                continue
    return None


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` itself (all its threads, not its children)."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime (fields 14, 15)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """The sweep (module docstring)."""
    mixes = requests(args.max_tokens)
    outcomes: Counter[str] = Counter()
    details: Counter[str] = Counter()
    served_by: Counter[str] = Counter()
    statuses_503: list[dict[str, Any]] = []
    events: dict[str, Any] = {}
    done = 0
    third, two_thirds = asyncio.Event(), asyncio.Event()
    connector = aiohttp.TCPConnector(limit=args.concurrency)
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        async with session.get(f"{args.url}/routes") as resp:
            pid = gateway_pid(await resp.json())
        cpu_before = process_cpu_seconds(pid) if pid is not None else 0.0
        started_at, started = time.time(), time.monotonic()
        gate = asyncio.Semaphore(args.concurrency)

        async def one(i: int) -> None:
            nonlocal done
            path, body, headers, label = mixes[i % len(mixes)]
            async with gate:
                t0 = time.monotonic() - started
                try:
                    async with session.post(args.url + path, json=body, headers=headers) as r:
                        content = await r.read()
                        status, backend = r.status, r.headers.get("x-specgate-backend", "-")
                except (TimeoutError, aiohttp.ClientError) as exc:
                    status, content, backend = 0, b"", "-"
                    outcome, detail = "lost", type(exc).__name__
                else:
                    outcome, detail = classify(status, content, bool(body.get("stream")))
            outcomes[outcome] += 1
            if detail:
                details[f"{outcome}: {detail}"] += 1
            served_by[backend] += 1
            if status == 503:
                text = content[:300].decode("utf-8", "replace")
                statuses_503.append({"at_s": round(t0, 1), "request": label, "body": text})
            done += 1
            if done >= args.requests / 3:
                third.set()
            if done >= 2 * args.requests / 3:
                two_thirds.set()

        async def kill() -> None:
            await third.wait()
            pid = await backend_pid(session, args.url, args.kill)
            at = round(time.monotonic() - started, 1)
            events["kill"] = {"backend": args.kill, "pid": pid, "at_s": at}
            if pid is not None:
                os.kill(pid, signal.SIGKILL)

        async def reload() -> None:
            await two_thirds.wait()
            async with session.post(f"{args.url}/routes/reload") as resp:
                at = round(time.monotonic() - started, 1)
                events["reload"] = {"status": resp.status, "at_s": at}

        await asyncio.gather(kill(), reload(), *(one(i) for i in range(args.requests)))
        elapsed = time.monotonic() - started
        # near 1.0 the gateway was busy with its own work; well under it with slow probes,
        # something else held it up (the CPU, a blocked loop)
        cpu_share = (process_cpu_seconds(pid) - cpu_before) / elapsed if pid else None
        async with session.get(f"{args.url}/routes/quarantine") as resp:
            quarantine = await resp.json()
        async with session.get(f"{args.url}/metrics") as resp:
            metrics = await resp.text()
    deaths = [
        line for line in metrics.splitlines()
        if line.startswith(("specgate_backend_deaths_total", "specgate_quarantine"))
    ]  # fmt: skip
    return {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "started_at": started_at,
        "elapsed_s": round(elapsed, 1),
        "gateway_pid": pid,
        "gateway_cpu_share": None if cpu_share is None else round(cpu_share, 2),
        "outcomes": dict(outcomes),
        "details": dict(details),
        "served_by": dict(served_by),
        "responses_503": statuses_503,
        "events": events,
        "quarantine": quarantine,
        "death_metrics": deaths,
    }


def probe_timeline(
    samples: dict[str, Any], started_at: float, window_s: float
) -> list[dict[str, Any]]:
    """Main-port ``/health`` per ``window_s`` window from ``started_at`` (``time.time()``):
    start (s), probes, p50/max (ms), answers other than 200."""
    seen = samples["/health"]
    windows: dict[int, list[float]] = {}
    for at, latency in zip(seen["at"], seen["latency"], strict=True):
        windows.setdefault(int((at - started_at) // window_s), []).append(latency)
    return [
        {"from_s": k * window_s, "probes": len(v),
         "p50_ms": round(percentile(v, 50) * 1000, 1), "max_ms": round(max(v) * 1000, 1)}
        for k, v in sorted(windows.items())
    ]  # fmt: skip


def report(results: dict[str, Any]) -> list[str]:
    """The outcome table and the probe table as Markdown lines."""
    meta = results["meta"]
    lines = [
        f"{meta['at']}, commit {meta['commit']}, {results['requests']} requests, "
        f"{results['concurrency']} at a time, {results['elapsed_s']} s, load average "
        f"{meta['load_average'][0]:.1f} -> {meta['load_average'][1]:.1f}, gateway CPU share "
        f"{results['gateway_cpu_share']}",
        "",
        "| outcome | count |",
        "| --- | --- |",
        *(f"| {k} | {v} |" for k, v in sorted(results["outcomes"].items())),
        *(f"| {k} | {v} |" for k, v in sorted(results["details"].items())),
        f"| 503 | {len(results['responses_503'])} |",
        f"| quarantined | {len(results['quarantine'].get('quarantined') or [])} |",
        f"| events | {json.dumps(results['events'])} |",
        "",
        *probe_table(results["probes"]),
    ]
    return lines


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True)  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--concurrency", type=int, default=400)
    parser.add_argument("--requests", type=int, default=1200)
    parser.add_argument("--kill", default="ngram")
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--probe-interval-ms", type=float, default=50.0)
    parser.add_argument("--health-port", type=int,
                        default=os.environ.get("SPECGATE_HEALTH_PORT") or None)  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("bench/out/sweep"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    host = args.url.removeprefix("http://").rsplit(":", 1)[0]
    port_url = f"http://{host}:{args.health_port}" if args.health_port else None
    bare_port = free_port()
    bare_argv = [sys.executable, "-m", "uvicorn", "--factory", "bench.health_load:bare_app"]
    bare_argv += ["--port", str(bare_port), "--loop", "uvloop", "--http", "httptools"]
    bare_url = f"http://127.0.0.1:{bare_port}"
    bare = Server("bare", bare_argv, ready_url=bare_url + "/health",
                  log_path=args.out / "bare.log")  # fmt: skip
    load_before = load_average()
    with bare:
        interval_s = args.probe_interval_ms / 1000
        start_at = time.time() + 2.0  # the prober's imports take a moment
        prober = start_prober(args.url, start_at, math.inf, interval_s, bare_url, port_url)
        time.sleep(start_at - time.time())
        try:
            results = asyncio.run(run(args))
        finally:
            prober.send_signal(signal.SIGINT)
            stdout, _ = prober.communicate(timeout=60)
    samples = json.loads(stdout)
    (args.out / "probes.json").write_text(json.dumps(samples))  # every probe, for timelines
    results["probes"] = probe_figures(samples)
    results["health_timeline"] = probe_timeline(samples, results["started_at"], 30.0)
    results["meta"] = {
        "commit": _commit(),
        "probe_interval_ms": args.probe_interval_ms,
        "health_port": args.health_port,
        "load_average": [load_before, load_average()],
        "machine": machine(),
        "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    lines = report(results)
    (args.out / "sweep.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
