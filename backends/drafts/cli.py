"""``specgate drafts ...``: check (the gate) and train EAGLE-3 heads for the local target.

- ``check DIR [--config FILE] [--k 1,2,3] [--prompts N] [--data DIR]`` (``--prompts`` is
  ``--gate-prompts`` elsewhere): bad input is refused
  before any server starts (exit 2); a head whose greedy output differs from plain is refused
  (exit 1); a lossless head under 1.1x plain is "not worth serving" (exit 0, said).
- ``train --config FILE --prompts JSONL|--from-capture [DIR] [--tasks T,T] --out DIR [...]``:
  distill, prepare-data, hidden states, train, strip, then the gate (``pipeline.py``); with
  ``--from-capture`` the gateway's captured prompts are converted first (``from_capture.py``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from contracts.config import ConfigError, load_config
from contracts.launch_profile import BackendProfile

#: The repository's root (``config/``, ``../shared`` beside the clone).
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = REPO_ROOT / "config" / "local.yaml"
DEFAULT_DATA = REPO_ROOT.parent / "shared" / "datasets" / "prompts"


def say(line: str) -> None:
    """Print one progress line now (stdout may be a file)."""
    print(line, flush=True)


def add_drafts_commands(sub: Any) -> None:
    """Register ``specgate drafts`` and its subcommands on the top-level subparsers."""
    drafts = sub.add_parser("drafts", help="EAGLE-3 draft heads: check (the gate) and train")
    commands = drafts.add_subparsers(dest="drafts_command", required=True)

    check = commands.add_parser("check", help="lossless? accepted? faster? writes gate.json")
    check.add_argument("head", type=Path, help="the head folder (config.json, model.safetensors)")
    _common(check, "--prompts")

    train = commands.add_parser("train", help="build a head: distill, hidden states, train")
    source = train.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompts", type=Path, help='{"id","messages"} JSONL')
    source.add_argument(
        "--from-capture",
        type=Path,
        nargs="?",
        const=True,
        metavar="DIR",
        help="the gateway's captured prompts (default: the config's capture.dir, else "
        "capture/ under the cache dir)",
    )
    train.add_argument("--tasks", help="with --from-capture: tasks to use, e.g. code,chat")
    train.add_argument("--out", type=Path, required=True, help="the head folder to write")
    train.add_argument("--engine", choices=("transformers", "vllm"), default="transformers")
    train.add_argument("--max-samples", type=int, default=0, help="0: all prompts")
    train.add_argument("--epochs", type=int, default=3)
    train.add_argument("--max-new-tokens", type=int, default=320, help="answer length cap")
    train.add_argument("--draft-vocab-size", type=int, default=8192)
    train.add_argument("--work", type=Path, help="stage outputs (default: OUT.work)")
    train.add_argument("--dry-run", action="store_true", help="save an untrained head")
    train.add_argument("--no-gate", action="store_true", help="skip the gate at the end")
    _common(train)


def _common(p: argparse.ArgumentParser, *prompt_flags: str) -> None:
    """Flags of the gate: ``check`` also takes ``--prompts N`` (``train``'s is the JSONL)."""
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="names the target")
    p.add_argument("--k", default="1,2,3", help="speculative tokens to try, e.g. 1,2,3")
    p.add_argument(
        "--gate-prompts",
        *prompt_flags,
        dest="gate_prompts",
        type=int,
        default=8,
        help="held-out prompts per task (chat, code)",
    )
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="held-out gate prompts")


def plain_target(config_path: Path) -> tuple[Path, str]:
    """The target folder and served name of the config's plain local backend.

    Raises ValueError naming the config when it is invalid or has no plain local backend,
    or when the target folder is missing (``specgate models prepare`` builds it).
    """
    from backends.models import resolve_profile
    from contracts.paths import CachePaths

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    profiles: list[BackendProfile] = [
        b.profile
        for b in config.backends.values()
        if b.profile is not None and not b.profile.speculation.speculative
    ]
    if not profiles:
        raise ValueError(f"{config_path}: no plain backend with a profile names the target")
    profile = resolve_profile(profiles[0], CachePaths.default())
    target = Path(profile.model)
    if not (target / "config.json").is_file():
        raise ValueError(f"{target}: target model folder missing (specgate models prepare)")
    return target, profile.served_model_name


def parse_ks(text: str) -> tuple[int, ...]:
    """``"1,2,3"`` -> ``(1, 2, 3)``; ValueError unless 1 <= k <= 32."""
    try:
        ks = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--k {text!r}: expected integers like 1,2,3") from None
    if not ks or any(not 1 <= k <= 32 for k in ks):
        raise ValueError(f"--k {text!r}: each k must be 1..32")
    return ks


def run_drafts_command(args: argparse.Namespace) -> int:
    """Run ``specgate drafts check|train``; returns the exit code."""
    if args.drafts_command == "check":
        return cmd_check(args)
    from backends.drafts.pipeline import cmd_train

    return cmd_train(args)


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
