"""``specgate drafts check``: the gate an EAGLE-3 head passes before it is served.

Starts a plain vLLM server of the target and, for each k, a server with the head
(:class:`~backends.launcher.LocalBackend`, free ports, fp32, ``--enforce-eager``,
``--kv-cache-memory-bytes 512M``), sends held-out prompts (the shared dev split's chat and
code prompts) greedily, each to plain and then to the head's server, and compares outputs and
times. Acceptance comes from the head server's spec-decode counter deltas. Writes ``gate.json``
in the head folder (atomically) and returns the report; arithmetic in ``gate_report.py``.
CLI-time, blocking code.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from backends.drafts.gate_report import (
    TaskTiming,
    counter_delta,
    render_table,
    spec_counters,
    summarise_k,
    verdict,
)
from backends.launcher import LocalBackend
from contracts.acceptance import SpecCounters
from contracts.launch_profile import BackendProfile, Speculation

LogFn = Callable[[str], None]

#: Prompts longer than this (characters) are skipped: the gate measures decoding, not prefill.
MAX_PROMPT_CHARS = 3000
GATE_TASKS: tuple[str, ...] = ("chat", "code")


@dataclass(frozen=True)
class GateSettings:
    """What one gate run measures: ks, prompts per task, tokens per answer, where logs go."""

    ks: Sequence[int] = (1, 2, 3)
    prompts_per_task: int = 8
    max_tokens: int = 128
    startup_timeout_s: float = 600.0
    request_timeout_s: float = 600.0


def load_gate_prompts(data: Path, per_task: int) -> list[tuple[str, str]]:
    """``(task, prompt)`` pairs: the first ``per_task`` single-turn chat-format prompts of
    ``data/{chat,code}.jsonl``. Raises ValueError naming file:line for a bad line, and for a
    missing file."""
    out: list[tuple[str, str]] = []
    for task in GATE_TASKS:
        path = data / f"{task}.jsonl"
        if not path.is_file():
            raise ValueError(f"{path}: missing (gate prompts; use --data DIR)")
        taken = 0
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if taken >= per_task:
                    break
                try:
                    item = json.loads(line)
                    prompt = item["prompt"]
                except (ValueError, KeyError, TypeError) as exc:
                    raise ValueError(f"{path}:{number}: bad prompt line: {exc}") from None
                if item.get("turns") or item.get("prompt_format") == "completion":
                    continue
                if not isinstance(prompt, str) or len(prompt) > MAX_PROMPT_CHARS:
                    continue
                out.append((task, prompt))
                taken += 1
    return out


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def gate_profile(target: Path, served: str, speculation: Speculation) -> BackendProfile:
    """A local CPU profile: fp32, eager, 512M of KV cache, on a free port."""
    return BackendProfile(
        model=str(target),
        served_model_name=served,
        port=free_port(),
        dtype="float32",
        max_model_len=8192,
        speculation=speculation,
        extra_args=["--enforce-eager", "--kv-cache-memory-bytes", "512M"],
        env={"VLLM_CPU_OMP_THREADS_BIND": "nobind"},
    )


class _Client:
    """Greedy chat requests and ``/metrics`` reads over one httpx client."""

    def __init__(self, served: str, settings: GateSettings) -> None:
        self.served, self.settings = served, settings
        self.http = httpx.Client(timeout=httpx.Timeout(settings.request_timeout_s, connect=5.0))

    def ask(self, url: str, prompt: str) -> tuple[str, int, float]:
        """``(text, completion tokens, seconds)`` of one greedy answer."""
        body = {
            "model": self.served,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": 0,
            "max_tokens": self.settings.max_tokens,
        }
        started = time.monotonic()
        reply = self.http.post(f"{url}/v1/chat/completions", json=body)
        reply.raise_for_status()
        data = reply.json()
        seconds = time.monotonic() - started
        return data["choices"][0]["message"]["content"], data["usage"]["completion_tokens"], seconds

    def counters(self, url: str) -> SpecCounters:
        reply = self.http.get(f"{url}/metrics")
        reply.raise_for_status()
        return spec_counters(reply.text)


def _start(backend: LocalBackend, timeout_s: float, log: LogFn) -> None:
    backend.start()
    log(f"[{backend.name}] started on {backend.url} (log {backend.log_path})")
    seconds = backend.wait_healthy(timeout_s)
    log(f"[{backend.name}] healthy after {seconds:.0f} s")


def _measure_k(
    client: _Client, plain: str, head: str, prompts: list[tuple[str, str]], k: int, log: LogFn
) -> dict[str, Any]:
    for url in (plain, head):  # the first request of a fresh server pays one-off costs
        client.ask(url, prompts[0][1])
    before = client.counters(head)
    tasks = {task: TaskTiming() for task in dict.fromkeys(t for t, _ in prompts)}
    for i, (task, prompt) in enumerate(prompts, 1):
        a, tokens, plain_s = client.ask(plain, prompt)
        b, _, head_s = client.ask(head, prompt)
        tasks[task].add(a == b, tokens, plain_s, head_s, f"{task} #{i}: {a[:60]!r} vs {b[:60]!r}")
        log(f"k={k} {i}/{len(prompts)} {task}: {'same' if a == b else 'DIFFERENT'}")
    return summarise_k(k, counter_delta(client.counters(head), before), tasks)


def run_gate(
    head: Path,
    target: Path,
    served: str,
    python: Path,
    data: Path,
    logs: Path,
    settings: GateSettings,
    *,
    log: LogFn = print,
) -> dict[str, Any]:
    """Measure ``head`` against plain ``target`` at each k; write and return ``gate.json``.

    The report holds ``results`` (one :func:`summarise_k` entry per k), ``verdict``
    (:func:`verdict`) and ``table`` (text). Servers are always stopped. Raises ValueError for
    bad prompts, BackendError when a server does not start, httpx.HTTPError on failed requests.
    """
    prompts = load_gate_prompts(data, settings.prompts_per_task)
    client = _Client(served, settings)
    plain_backend = LocalBackend(
        "gate-plain", gate_profile(target, served, Speculation()), python, logs / "gate-plain.log"
    )
    results: list[dict[str, Any]] = []
    try:
        _start(plain_backend, settings.startup_timeout_s, log)
        for k in settings.ks:
            spec = Speculation(method="eagle3", model=str(head), num_speculative_tokens=k)
            backend = LocalBackend(
                f"gate-eagle3-k{k}",
                gate_profile(target, served, spec),
                python,
                logs / f"gate-eagle3-k{k}.log",
            )
            try:
                _start(backend, settings.startup_timeout_s, log)
                results.append(_measure_k(client, plain_backend.url, backend.url, prompts, k, log))
            finally:
                backend.stop()
    finally:
        plain_backend.stop()
        client.http.close()
    decision = verdict(results)
    report = {
        "head": str(head),
        "target": str(target),
        "prompts_per_task": settings.prompts_per_task,
        "max_tokens": settings.max_tokens,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "results": results,
        "verdict": decision,
    }
    tmp = head / "gate.json.tmp"
    tmp.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    tmp.replace(head / "gate.json")
    return {**report, "table": render_table(results, decision)}
