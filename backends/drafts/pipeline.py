"""``specgate drafts train``: build an EAGLE-3 head for the target, stage by stage.

Stages (each writes ``WORK/<stage>.done`` last and is skipped when that marker exists, so a
rerun resumes where the last run stopped; distill and hidden also resume inside the stage):

1. ``distill``  ``hf_stages.py distill`` in the vLLM venv: the target answers the prompts
                (self-distillation) -> ``WORK/rows.jsonl`` (speculators rows).
2. ``prepare``  ``speculators prepare-data`` -> ``WORK/prep`` (arrow dataset, token frequencies).
3. ``hidden``   ``hf_stages.py hidden`` -> ``WORK/hs/hs_{i}.safetensors`` (bf16, 4 tensors of
                ``hidden_size`` per token: 4 x hidden x 2 bytes per token on disk).
4. ``train``    ``cpu_train.py train`` (speculators' trainer, patched for CPU when there is no
                CUDA) -> ``WORK/ckpt``; the hidden states are deleted afterwards.
5. ``head``     best checkpoint -> ``OUT.tmp`` -> strip the embedding -> renamed to ``OUT``:
                a half-written head is never at ``OUT``.
6. ``gate``     ``specgate drafts check OUT`` (``--no-gate`` skips it).

The speculators stages run in the speculators venv (``spec_env.py``). CLI-time, blocking code.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from backends.drafts.hf_stages import _read_prompts
from backends.vllm_env import LogFn, SetupError, run_command

HERE = Path(__file__).resolve().parent
HF_STAGES, CPU_TRAIN = HERE / "hf_stages.py", HERE / "cpu_train.py"
#: Rough rates on one busy CPU core (tokens per second; transformers distillation measured at
#: 8-20 tok/s here, training ~290 tok/s in ../shared/notes/eagle3.md), for the ETA only.
CPU_RATES = {"distill": 15.0, "prepare": 5000.0, "hidden": 300.0, "train": 290.0}
#: Seconds each stage spends loading models and starting up.
STAGE_START_S = 20.0
SEQ_LENGTH = 1536


@dataclass(frozen=True)
class Plan:
    """What a run will do: prompts, estimated tokens, and the disk the hidden states need."""

    prompts: int
    tokens: int
    hidden_size: int

    @property
    def hidden_bytes(self) -> int:
        """4 hidden states (3 auxiliary layers + last) x hidden_size x 2 bytes (bf16) per token."""
        return self.tokens * 4 * self.hidden_size * 2

    def eta_s(self, stage: str, epochs: int = 1) -> float:
        """Seconds a CPU stage is expected to take (0 for stages without a rate)."""
        rate = CPU_RATES.get(stage)
        if not rate:
            return 0.0
        return STAGE_START_S + self.tokens * (epochs if stage == "train" else 1) / rate


def plan_run(prompts: Path, max_samples: int, max_new_tokens: int, hidden_size: int) -> Plan:
    """Read every prompt line (ValueError naming ``file:line`` for a bad one) and estimate
    tokens: about 4 characters a token for the messages, plus ``max_new_tokens`` answered."""
    count, tokens = 0, 0
    for _id, messages in _read_prompts(prompts):
        if max_samples and count >= max_samples:
            continue  # still validate the remaining lines
        count += 1
        chars = sum(len(str(m.get("content", ""))) for m in messages if isinstance(m, dict))
        tokens += chars // 4 + 8 * len(messages) + max_new_tokens
    if count == 0:
        raise ValueError(f"{prompts}: no prompts")
    return Plan(count, tokens, hidden_size)


class Stages:
    """Runs the stages of one head build with markers, progress lines and ETAs."""

    def __init__(self, work: Path, plan: Plan, epochs: int, log: LogFn = print) -> None:
        self.work, self.plan, self.epochs, self.log = work, plan, epochs, log
        self.names = ["distill", "prepare", "hidden", "train", "head"]

    def marker(self, stage: str) -> Path:
        return self.work / f"{stage}.done"

    def run(self, stage: str, action: Callable[[], None]) -> None:
        """Run ``action`` unless ``stage`` is marked done; mark it afterwards."""
        number = f"[{self.names.index(stage) + 1}/{len(self.names)}] {stage}"
        if self.marker(stage).exists():
            self.log(f"{number}: done before, skipped ({self.marker(stage)})")
            return
        eta = self.plan.eta_s(stage, self.epochs)
        self.log(f"{number}: starting" + (f" (ETA ~{eta:.0f} s on one CPU core)" if eta else ""))
        started = time.monotonic()
        action()
        self.marker(stage).write_text(f"{time.monotonic() - started:.1f}\n")
        self.log(f"{number}: done in {time.monotonic() - started:.0f} s")


def best_checkpoint(ckpt: Path) -> Path:
    """The folder holding the trained head: ``checkpoint_best``, else the highest epoch
    folder, else ``ckpt`` itself (a dry run saves there). FileNotFoundError if none."""
    candidates = [ckpt / "checkpoint_best"]
    epochs = sorted((p for p in ckpt.glob("[0-9]*") if p.is_dir()), key=lambda p: int(p.name))
    candidates += epochs[::-1] + [ckpt]
    for folder in candidates:
        if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file():
            return folder
    raise FileNotFoundError(f"{ckpt}: no checkpoint with config.json and model.safetensors")


def publish_head(source: Path, out: Path, strip: Callable[[Path], None]) -> None:
    """Copy ``source``'s head files to ``OUT.tmp``, ``strip`` it there, then rename it to
    ``out`` (an old ``out`` is replaced only once the new head is complete)."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copy2(source / name, tmp / name)
    strip(tmp)
    old = out.with_name(out.name + ".old")
    if out.exists():
        shutil.rmtree(old, ignore_errors=True)
        out.replace(old)
    for path in (tmp, *tmp.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)  # servable by other users
    tmp.replace(out)
    shutil.rmtree(old, ignore_errors=True)


def cmd_train(args: argparse.Namespace) -> int:
    """``specgate drafts train``: check inputs (exit 2), then run the stages (exit 1 on a
    failed stage, else the gate's exit code)."""
    from backends.drafts.cli import parse_ks, plain_target, say
    from backends.drafts.head_check import HeadError, read_json
    from contracts.config import ConfigError

    try:
        if args.engine != "transformers":
            raise ValueError("--engine vllm is not implemented yet; use transformers")
        ks = parse_ks(args.k)
        for flag in ("epochs", "max_new_tokens", "gate_prompts", "draft_vocab_size"):
            if getattr(args, flag) < 1:
                raise ValueError(f"--{flag.replace('_', '-')} must be at least 1")
        target, served = plain_target(args.config)
        hidden_size = int(read_json(target / "config.json")["hidden_size"])
        if args.from_capture is not None:
            args.prompts = prompts_from_capture(args)
        elif args.tasks is not None:
            raise ValueError("--tasks goes with --from-capture")
        plan = plan_run(args.prompts, args.max_samples, args.max_new_tokens, hidden_size)
        if not args.no_gate:  # refused now, not after hours of training
            from backends.drafts.gate import load_gate_prompts

            load_gate_prompts(args.data, args.gate_prompts)
    except (HeadError, ValueError, OSError, KeyError, ConfigError) as exc:
        print(f"specgate drafts train: {exc}", file=sys.stderr)
        return 2
    say(
        f"{plan.prompts} prompts, about {plan.tokens:,} tokens; hidden states need about "
        f"{plan.hidden_bytes / 1e9:.2f} GB of disk (deleted after training)"
    )
    from backends.drafts.train_run import run_stages

    try:
        run_stages(args, target, plan, log=say)
    except (SetupError, FileNotFoundError) as exc:
        print(f"specgate drafts train: {exc}", file=sys.stderr)
        return 1
    say(f"head written: {args.out}")
    if args.no_gate:
        return 0
    from backends.drafts.cli import run_check
    from backends.drafts.gate import GateSettings

    settings = GateSettings(ks=ks, prompts_per_task=args.gate_prompts)
    return run_check(args.out, target, served, args.data, settings)


def work_dir(args: argparse.Namespace) -> Path:
    """Where the stages write: ``--work``, else ``OUT.work``."""
    return args.work or args.out.with_name(args.out.name + ".work")  # type: ignore[no-any-return]


def prompts_from_capture(args: argparse.Namespace) -> Path:
    """Convert the captured prompts (``--from-capture [DIR]``, ``--tasks``) into
    ``WORK/capture-prompts.jsonl`` and return its path; ValueError (naming ``file:line``
    for a bad line) or OSError when they cannot be used."""
    from backends.drafts.cli import say
    from backends.drafts.from_capture import convert_capture, parse_tasks, write_prompts
    from contracts.config import load_config
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


def stage_command(python: Path, script: Path, *argv: str | Path) -> list[str]:
    """``[python, script, *argv]`` as strings."""
    return [str(python), str(script), *map(str, argv)]


def run_logged(command: list[str], log: LogFn = print) -> list[str]:
    """:func:`~backends.vllm_env.run_command` with unbuffered Python output."""
    return run_command(command, log=log, env={"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"})
