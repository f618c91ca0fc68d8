"""The commands behind each stage of ``specgate drafts train`` (see ``pipeline.py``)."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from backends.drafts.pipeline import (
    CPU_TRAIN,
    HF_STAGES,
    SEQ_LENGTH,
    Plan,
    Stages,
    best_checkpoint,
    publish_head,
    run_logged,
    stage_command,
    work_dir,
)
from backends.drafts.spec_env import ensure_speculators_env
from backends.vllm_env import LogFn, ensure_vllm_env
from contracts.paths import CachePaths


def run_stages(args: argparse.Namespace, target: Path, plan: Plan, log: LogFn = print) -> None:
    """Run stages 1-5 for ``args`` (``specgate drafts train``'s flags) into ``args.out``.

    Raises SetupError when a stage's command fails (its output tail included), and
    FileNotFoundError when training left no checkpoint.
    """
    paths = CachePaths.default()
    vllm_python = ensure_vllm_env(paths, log=log)
    spec_python = ensure_speculators_env(paths, vllm_python, log=log)
    work = work_dir(args)
    work.mkdir(parents=True, exist_ok=True)
    stages = Stages(work, plan, args.epochs, log)
    if not (args.out / "model.safetensors").is_file():
        stages.marker("head").unlink(missing_ok=True)  # the head was removed since: redo it
    rows, prep, hs, ckpt = work / "rows.jsonl", work / "prep", work / "hs", work / "ckpt"

    def distill() -> None:
        run_logged(
            stage_command(
                vllm_python, HF_STAGES, "distill", "--model", target, "--prompts", args.prompts,
                "--out", rows, "--max-new-tokens", args.max_new_tokens,
                "--limit", args.max_samples, "--batch-size", 16,
            ),
            log,
        )  # fmt: skip

    def prepare() -> None:
        shutil.rmtree(prep, ignore_errors=True)  # speculators refuses a partial output
        command = [
            str(spec_python), "-m", "speculators", "prepare-data", "--model", str(target),
            "--data", str(rows), "--output", str(prep), "--seq-length", str(SEQ_LENGTH),
            "--no-skip-token-freq", "--num-preprocessing-workers", "1",
        ]  # fmt: skip
        if args.max_samples:
            command += ["--max-samples", str(args.max_samples)]
        run_logged(command, log)

    def hidden() -> None:
        if args.dry_run:
            hs.mkdir(exist_ok=True)  # an untrained head needs no hidden states
            return
        run_logged(
            stage_command(
                spec_python, HF_STAGES, "hidden", "--model", target, "--data", prep, "--out", hs,
                "--batch-tokens", 8192,
            ),
            log,
        )  # fmt: skip

    def train() -> None:
        command = stage_command(
            spec_python, CPU_TRAIN, "train", "--verifier-name-or-path", target,
            "--data-path", prep, "--hidden-states-path", hs, "--save-path", ckpt,
            "--draft-vocab-size", args.draft_vocab_size,
            "--token-freq-path", prep / "token_freq.pt", "--epochs", args.epochs,
            "--on-missing", "raise", "--num-workers", 0, "--total-seq-len", 2 * SEQ_LENGTH,
        )  # fmt: skip
        if args.dry_run:
            command.append("--dry-run")
        run_logged(command, log)
        shutil.rmtree(hs, ignore_errors=True)
        log(f"deleted the hidden states ({hs})")

    def head() -> None:
        source = best_checkpoint(ckpt)
        log(f"head from {source}")
        publish_head(
            source,
            args.out,
            lambda folder: run_logged(
                stage_command(vllm_python, HF_STAGES, "strip", "--head", folder), log
            ),
        )

    for name, action in (
        ("distill", distill),
        ("prepare", prepare),
        ("hidden", hidden),
        ("train", train),
        ("head", head),
    ):
        stages.run(name, action)
