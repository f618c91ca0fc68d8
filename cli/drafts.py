"""``specgate drafts ...``: the argument parser of ``check`` (the gate) and ``train``
(EAGLE-3 heads for the local target); what the commands do is ``backends/drafts/commands.py``.

- ``check DIR [--config FILE] [--k 1,2,3] [--prompts N] [--data DIR]`` (``--prompts`` is
  ``--gate-prompts`` elsewhere): bad input is refused
  before any server starts (exit 2); a head whose greedy output differs from plain is refused
  (exit 1); a lossless head under 1.1x plain is "not worth serving" (exit 0, said).
- ``train --config FILE --prompts JSONL|--from-capture [DIR] [--tasks T,T] --out DIR
  [--engine transformers|vllm [--server URL]] [...]``: distill (``vllm_distill.py`` for the
  vllm engine), prepare-data, hidden states, train, strip, then the gate
  (``backends/drafts/pipeline.py``); with ``--from-capture`` the gateway's captured prompts
  are converted first (``backends/drafts/from_capture.py``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from backends.drafts.commands import cmd_check, cmd_train

#: The repository's root (``config/``, ``../shared`` beside the clone).
REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO_ROOT / "config" / "local.yaml"
DEFAULT_DATA = REPO_ROOT.parent / "shared" / "datasets" / "prompts"


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
    train.add_argument(
        "--engine",
        choices=("transformers", "vllm"),
        default="transformers",
        help="who answers the prompts: transformers in the vLLM venv, or a vLLM server",
    )
    train.add_argument(
        "--server",
        metavar="URL",
        help="with --engine vllm: a running vLLM server of the target (default: start one)",
    )
    train.add_argument(
        "--concurrency", type=int, default=8, help="with --engine vllm: requests at a time"
    )
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


def run_drafts_command(args: argparse.Namespace) -> int:
    """Run ``specgate drafts check|train``; returns the exit code."""
    if args.drafts_command == "check":
        return cmd_check(args)
    return cmd_train(args)
