"""What ``specgate drafts check`` and ``specgate drafts train`` do, below the argument parser
(``cli/drafts.py``): validate the inputs (exit 2), run the stages and the gate, return the
exit code. The training stages are ``train_run.py``, the gate ``gate.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from backends.drafts.pipeline import plain_target, plan_run, work_dir
from backends.vllm_env import SetupError
from contracts.config import ConfigError, load_config


def say(line: str) -> None:
    """Print one progress line now (stdout may be a file)."""
    print(line, flush=True)


def parse_ks(text: str) -> tuple[int, ...]:
    """``"1,2,3"`` -> ``(1, 2, 3)``; ValueError unless 1 <= k <= 32."""
    try:
        ks = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--k {text!r}: expected integers like 1,2,3") from None
    if not ks or any(not 1 <= k <= 32 for k in ks):
        raise ValueError(f"--k {text!r}: each k must be 1..32")
    return ks


def cmd_check(args: argparse.Namespace) -> int:
    """Validate the head and inputs (exit 2 on bad input), then run the gate."""
    from backends.drafts.gate import GateSettings, load_gate_prompts
    from backends.drafts.head_check import HeadError, check_head

    try:
        ks = parse_ks(args.k)
        if args.gate_prompts < 1:
            raise ValueError(f"--prompts {args.gate_prompts}: at least 1 prompt per task")
        target, served = plain_target(args.config)
        info = check_head(args.head, target)
        load_gate_prompts(args.data, args.gate_prompts)
    except (HeadError, ValueError) as exc:
        print(f"specgate drafts check: {exc}", file=sys.stderr)
        return 2
    print(f"head {info.path}: {len(info.tensors)} tensors, {info.size_bytes / 1e6:.1f} MB")
    settings = GateSettings(ks=ks, prompts_per_task=args.gate_prompts)
    return run_check(args.head, target, served, args.data, settings)


def run_check(head: Path, target: Path, served: str, data: Path, settings: Any) -> int:
    """Run the gate on a checked head; print the table; 1 if refused, else 0."""
    import httpx

    from backends.drafts.gate import run_gate
    from backends.launcher import BackendError
    from backends.vllm_env import SetupError, ensure_vllm_env
    from contracts.paths import CachePaths

    paths = CachePaths.default()
    try:
        python = ensure_vllm_env(paths, log=say)
        report = run_gate(head, target, served, python, data, paths.logs, settings, log=say)
    except (BackendError, SetupError, OSError, httpx.HTTPError) as exc:
        print(f"specgate drafts check: {exc}", file=sys.stderr)
        return 1
    print(report["table"])
    print(f"wrote {head / 'gate.json'}")
    return 1 if report["verdict"]["status"] == "refused" else 0


def cmd_train(args: argparse.Namespace) -> int:
    """``specgate drafts train``: check inputs (exit 2), then run the stages (exit 1 on a
    failed stage, else the gate's exit code)."""
    from backends.drafts.head_check import HeadError, read_json
    from backends.drafts.vllm_distill import DistillError

    try:
        if args.server is not None and args.engine != "vllm":
            raise ValueError("--server goes with --engine vllm")
        ks = parse_ks(args.k)
        for flag in ("epochs", "max_new_tokens", "gate_prompts", "draft_vocab_size", "concurrency"):
            if getattr(args, flag) < 1:
                raise ValueError(f"--{flag.replace('_', '-')} must be at least 1")
        target, served = plain_target(args.config)
        hidden_size = int(read_json(target / "config.json")["hidden_size"])
        if args.server is not None:  # a server of another model is refused before any write
            check_given_server(args.server, target, served)
        if args.from_capture is not None:
            args.prompts = prompts_from_capture(args)
        elif args.tasks is not None:
            raise ValueError("--tasks goes with --from-capture")
        plan = plan_run(args.prompts, args.max_samples, args.max_new_tokens, hidden_size)
        plan = dataclasses.replace(plan, engine=args.engine)
        if not args.no_gate:  # refused now, not after hours of training
            from backends.drafts.gate import load_gate_prompts

            load_gate_prompts(args.data, args.gate_prompts)
    except (HeadError, ValueError, OSError, KeyError, ConfigError, DistillError) as exc:
        print(f"specgate drafts train: {exc}", file=sys.stderr)
        return 2
    say(
        f"{plan.prompts} prompts, about {plan.tokens:,} tokens; hidden states need about "
        f"{plan.hidden_bytes / 1e9:.2f} GB of disk (deleted after training)"
    )
    from backends.drafts.train_run import run_stages
    from backends.launcher import BackendError

    try:
        run_stages(args, target, plan, log=say)
    except (SetupError, FileNotFoundError, DistillError, BackendError) as exc:
        print(f"specgate drafts train: {exc}", file=sys.stderr)
        return 1
    say(f"head written: {args.out}")
    if args.no_gate:
        return 0
    from backends.drafts.gate import GateSettings

    settings = GateSettings(ks=ks, prompts_per_task=args.gate_prompts)
    return run_check(args.out, target, served, args.data, settings)


def check_given_server(url: str, target: Path, served: str) -> None:
    """Refuse (DistillError) a ``--server`` that cannot be reached or serves another model."""
    import asyncio

    from backends.drafts.vllm_distill import DistillSettings, Server, check_server, http_client

    async def check() -> None:
        async with http_client(DistillSettings()) as client:
            await check_server(Server(client, url), target, served, say)

    asyncio.run(check())
    say(f"{url}: serves the target ({target})")


def prompts_from_capture(args: argparse.Namespace) -> Path:
    """Convert the captured prompts (``--from-capture [DIR]``, ``--tasks``) into
    ``WORK/capture-prompts.jsonl`` and return its path; ValueError (naming ``file:line``
    for a bad line) or OSError when they cannot be used."""
    from backends.drafts.from_capture import convert_capture, parse_tasks, write_prompts
    from contracts.paths import CachePaths

    tasks = parse_tasks(args.tasks)
    root = args.from_capture
    if root is True:  # no DIR: the config's capture.dir, else the cache's capture/
        configured = load_config(args.config).capture.dir
        root = configured.expanduser() if configured else CachePaths.default().capture
    found = convert_capture(root, tasks)
    if not found.prompts:
        raise ValueError(f"{root}: no captured prompts for {', '.join(tasks)}")
    out = work_dir(args) / "capture-prompts.jsonl"
    write_prompts(found.prompts, out)
    skipped = ", ".join(f"{n} {why}" for why, n in sorted(found.skipped.items()))
    say(
        f"capture {root}: {found.records} records, {len(found.prompts)} distinct prompts "
        f"({found.duplicates} duplicates{', skipped: ' + skipped if skipped else ''}) -> {out}"
    )
    return out
