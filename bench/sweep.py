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
caused the death, so none should be quarantined), and the deaths the gateway counted. Writes
``results.json`` and ``sweep.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

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
    started = time.monotonic()
    connector = aiohttp.TCPConnector(limit=args.concurrency)
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
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
        "elapsed_s": round(elapsed, 1),
        "outcomes": dict(outcomes),
        "details": dict(details),
        "served_by": dict(served_by),
        "responses_503": statuses_503,
        "events": events,
        "quarantine": quarantine,
        "death_metrics": deaths,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--concurrency", type=int, default=400)
    parser.add_argument("--requests", type=int, default=1200)
    parser.add_argument("--kill", default="ngram")
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--out", type=Path, default=Path("bench/out/sweep"))
    args = parser.parse_args(argv)
    results = asyncio.run(run(args))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    print(json.dumps({k: v for k, v in results.items() if k != "quarantine"}, indent=2))
    print("quarantined:", results["quarantine"].get("quarantined"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
