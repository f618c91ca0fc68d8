"""Checks of a running GPU stack (``config/gpu-single.yaml``) that the speed bench does not make.

``python -m bench.gpu_checks --config CONFIG --gateway URL --out DIR`` writes ``DIR/checks.json``:

- **added TTFT**: chat prompts (which every policy sends to the plain backend), each sent
  streamed to the plain backend directly and through the gateway, interleaved, one at a time;
  the per-prompt difference of the times to the first token (seconds) and its p50/p90, beside
  the backend's own TTFT;
- **greedy identity**: dev-split prompts at temperature 0 (``/v1/completions``, top-2
  ``logprobs``, ``return_token_ids``) on every backend; each speculative answer is judged
  against plain's with the canary's :func:`gateway.upstream.canary.compare` (matched,
  near-tie, fault, undecided) at the gateway's ``canary_near_tie_margin``;
- **memory**: ``nvidia-smi``'s memory per server process (MiB), mapped to backends by port,
  beside ``specgate backends plan``'s estimate for the same profiles.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from bench.llm_client import run_items
from bench.workloads import default_prompts_dir, sample
from contracts.config import GatewayConfig, load_config
from gateway.upstream.canary import compare, parse_completion


def added_ttft(
    config: GatewayConfig, gateway: str, prompts: Path, count: int, max_tokens: int = 16
) -> dict[str, Any]:
    """Paired TTFT, plain backend direct vs through ``gateway``, over ``count`` chat prompts."""
    plain = config.backends["plain"]
    model = plain.served_model
    items = [i for i in sample(prompts, count, 2000) if i.task == "chat"][:count]
    run_items(plain.base_url, model, items[:2], concurrency=1, max_tokens=4)  # warm both paths
    run_items(gateway, model, items[:2], concurrency=1, max_tokens=4)
    pairs, backends = [], []
    for item in items:
        direct = run_items(plain.base_url, model, [item], concurrency=1, max_tokens=max_tokens)
        routed = run_items(gateway, model, [item], concurrency=1, max_tokens=max_tokens)
        d, r = direct[0][0], routed[0][0]
        backends.append(r.backend)
        if d.ttft_s is not None and r.ttft_s is not None:
            pairs.append((d.ttft_s, r.ttft_s))
    added = sorted(r - d for d, r in pairs)
    direct_ttft = sorted(d for d, _ in pairs)
    q = statistics.quantiles(added, n=10) if len(added) >= 2 else [float("nan")] * 9
    return {
        "prompts": len(items),
        "pairs": len(pairs),
        "routed_to": {b or "?": backends.count(b) for b in set(backends)},
        "direct_ttft_p50_s": statistics.median(direct_ttft) if direct_ttft else None,
        "added_ttft_p50_s": statistics.median(added) if added else None,
        "added_ttft_p90_s": q[8],
    }


def greedy_identity(
    config: GatewayConfig, prompts: Path, per_task: int, max_tokens: int, margin: float
) -> dict[str, Any]:
    """Verdict counts per speculative backend against plain, and each non-match's details."""
    items = sample(prompts, per_task, 1500)
    texts = [i.body.get("prompt") or i.body["messages"][0]["content"] for i in items]
    answers: dict[str, list[Any]] = {}
    with httpx.Client(timeout=120) as client:
        for name, backend in config.backends.items():
            got = []
            for text in texts:
                body = {
                    "model": backend.served_model,
                    "prompt": text,
                    "temperature": 0,
                    "max_tokens": max_tokens,
                    "logprobs": 2,
                    "return_token_ids": True,
                }
                resp = client.post(f"{backend.base_url}/v1/completions", json=body)
                resp.raise_for_status()
                got.append(parse_completion(resp.json()))
            answers[name] = got
    out: dict[str, Any] = {}
    for name in answers:
        if name == "plain":
            continue
        verdicts = [
            compare(p, s, margin) for p, s in zip(answers["plain"], answers[name], strict=True)
        ]
        counts: dict[str, int] = {}
        for v in verdicts:
            counts[v.kind] = counts.get(v.kind, 0) + 1
        out[name] = {
            "prompts": len(verdicts),
            "counts": counts,
            "not_matched": [
                {"task": items[i].task, "id": items[i].id} | asdict(v)
                for i, v in enumerate(verdicts)
                if v.kind != "matched"
            ],
        }
    return out


def gpu_memory(config: GatewayConfig) -> dict[str, Any]:
    """``nvidia-smi`` memory per backend (MiB) and the device's total used, or the error."""
    try:
        apps = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        total = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        return {"error": str(exc)}
    per_pid = {}
    for line in apps.strip().splitlines():
        pid, mib = (x.strip() for x in line.split(","))
        per_pid[int(pid)] = {"mib": int(mib), "port": _server_port(int(pid))}
    by_backend = {}
    for name, backend in config.backends.items():
        port = backend.profile.port if backend.profile else None
        for info in per_pid.values():
            if port is not None and info["port"] == port:
                by_backend[name] = by_backend.get(name, 0) + info["mib"]
    used, size = (int(x) for x in total.strip().splitlines()[0].split(","))
    return {"by_backend_mib": by_backend, "processes": per_pid, "used_mib": used, "total_mib": size}


def _server_port(pid: int) -> int | None:
    """The ``--port`` of the vLLM API server that owns GPU process ``pid``: the process's own
    command line, else its parent's (vLLM's engine core is a child of the API server)."""
    for candidate in (pid, _parent(pid)):
        if candidate is None:
            continue
        try:
            args = Path(f"/proc/{candidate}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        for flag, value in zip(args, args[1:], strict=False):
            if flag == b"--port" and value.isdigit():
                return int(value)
    return None


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    """Run the three checks against a running stack; write ``OUT/checks.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("config/gpu-single.yaml"))
    parser.add_argument("--gateway", default="http://127.0.0.1:8000")
    parser.add_argument("--prompts", type=Path, default=default_prompts_dir())
    parser.add_argument("--ttft-prompts", type=int, default=40)
    parser.add_argument("--greedy-per-task", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--near-tie-margin", type=float, default=0.5)
    parser.add_argument("--out", type=Path, default=Path("bench/out/gpu"))
    args = parser.parse_args(argv)
    config = load_config(args.config)
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"memory": gpu_memory(config)}
    result["greedy"] = greedy_identity(
        config, args.prompts, args.greedy_per_task, args.max_tokens, args.near_tie_margin
    )
    result["ttft"] = added_ttft(config, args.gateway, args.prompts, args.ttft_prompts)
    (args.out / "checks.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(
        json.dumps(
            {k: v for k, v in result.items() if k != "memory"}
            | {"memory_by_backend_mib": result["memory"].get("by_backend_mib")},
            indent=1,
        )[:6000]
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
