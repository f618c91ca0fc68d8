"""The commands behind each stage of ``specgate drafts train`` (see ``pipeline.py``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
from collections.abc import Iterator
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
from backends.launcher import LocalBackend
from backends.vllm_env import LogFn, ensure_vllm_env
from contracts.launch_profile import BackendProfile, Speculation
from contracts.paths import CachePaths

#: Seconds a self-started distill server may take to answer /health.
STARTUP_TIMEOUT_S = 600.0


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
        if args.engine == "vllm":
            distill_on_vllm(args, target, rows, vllm_python, paths, log)
            return
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


def distill_on_vllm(
    args: argparse.Namespace,
    target: Path,
    rows: Path,
    python: Path,
    paths: CachePaths,
    log: LogFn = print,
) -> None:
    """The distill stage against ``args.server``, else against a plain vLLM server of the
    config's target started here (its plain backend's profile on a free port) and stopped
    at the end, on error and on Ctrl-C. Raises DistillError, BackendError."""
    from backends.drafts.pipeline import plain_profile
    from backends.drafts.vllm_distill import DistillSettings, distill_from

    profile = plain_profile(args.config)
    settings = DistillSettings(
        max_new_tokens=args.max_new_tokens, limit=args.max_samples, concurrency=args.concurrency
    )
    with contextlib.ExitStack() as stack:
        url = args.server or stack.enter_context(started_server(profile, python, paths, log))
        summary = asyncio.run(
            distill_from(
                url, target, profile.served_model_name, args.prompts, rows, settings, log=log
            )
        )
    log(json.dumps(summary))


@contextlib.contextmanager
def started_server(
    profile: BackendProfile, python: Path, paths: CachePaths, log: LogFn = print
) -> Iterator[str]:
    """A plain vLLM server of ``profile``'s model on a free port; yields its URL."""
    from backends.drafts.gate import free_port

    plain = profile.model_copy(update={"port": free_port(), "speculation": Speculation()})
    backend = LocalBackend("distill-plain", plain, python, paths.logs / "distill-plain.log")
    try:
        backend.start()
        log(f"[distill-plain] started on {backend.url} (log {backend.log_path})")
        seconds = backend.wait_healthy(
            STARTUP_TIMEOUT_S,
            on_progress=lambda s: log(f"[distill-plain] still starting ({s:.0f} s)"),
        )
        log(f"[distill-plain] healthy after {seconds:.0f} s")
        yield backend.url
    finally:
        backend.stop()
        log("[distill-plain] stopped")
