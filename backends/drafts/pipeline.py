"""``specgate drafts train``: build an EAGLE-3 head for the target, stage by stage.

Stages (each writes ``WORK/<stage>.done`` last and is skipped when that marker exists, so a
rerun resumes where the last run stopped; distill and hidden also resume inside the stage):

1. ``distill``  the target answers the prompts (self-distillation) -> ``WORK/rows.jsonl``
                (speculators rows): ``hf_stages.py distill`` in the vLLM venv
                (``--engine transformers``), or ``vllm_distill.py`` against a vLLM server of
                the target (``--engine vllm``: ``--server URL``, else one started here).
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
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from backends.drafts.hf_stages import _read_prompts
from backends.vllm_env import LogFn, run_command
from contracts.config import ConfigError, load_config
from contracts.launch_profile import BackendProfile

HERE = Path(__file__).resolve().parent
HF_STAGES, CPU_TRAIN = HERE / "hf_stages.py", HERE / "cpu_train.py"
#: Rough rates on one busy CPU core (tokens per second; transformers distillation measured at
#: 8-20 tok/s here, training ~290 tok/s in ../shared/notes/eagle3.md), for the ETA only.
CPU_RATES = {"distill": 15.0, "prepare": 5000.0, "hidden": 300.0, "train": 290.0}
#: vLLM CPU answers at 8 concurrent (the note's 176 tok/s), for ``--engine vllm``'s ETA.
VLLM_DISTILL_RATE = 176.0
#: Seconds each stage spends loading models and starting up.
STAGE_START_S = 20.0
SEQ_LENGTH = 1536


@dataclass(frozen=True)
class Plan:
    """What a run will do: prompts, estimated tokens, and the disk the hidden states need."""

    prompts: int
    tokens: int
    hidden_size: int
    engine: str = "transformers"

    @property
    def hidden_bytes(self) -> int:
        """4 hidden states (3 auxiliary layers + last) x hidden_size x 2 bytes (bf16) per token."""
        return self.tokens * 4 * self.hidden_size * 2

    def eta_s(self, stage: str, epochs: int = 1) -> float:
        """Seconds a CPU stage is expected to take (0 for stages without a rate)."""
        rate = CPU_RATES.get(stage)
        if stage == "distill" and self.engine == "vllm":
            rate = VLLM_DISTILL_RATE
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


def publish_head(source: Path, out: Path, strip: Callable[[Path], object]) -> None:
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


def work_dir(args: argparse.Namespace) -> Path:
    """Where the stages write: ``--work``, else ``OUT.work``."""
    return args.work or args.out.with_name(args.out.name + ".work")  # type: ignore[no-any-return]


def stage_command(python: Path, script: Path, *argv: str | Path | int) -> list[str]:
    """``[python, script, *argv]`` as strings."""
    return [str(python), str(script), *map(str, argv)]


def run_logged(command: list[str], log: LogFn = print) -> list[str]:
    """:func:`~backends.vllm_env.run_command` with unbuffered Python output."""
    return run_command(command, log=log, env={"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"})


def plain_target(config_path: Path) -> tuple[Path, str]:
    """The target folder and served name of the config's plain local backend (errors as
    :func:`plain_profile`)."""
    profile = plain_profile(config_path)
    return Path(profile.model), profile.served_model_name


def plain_profile(config_path: Path) -> BackendProfile:
    """The launch profile of the config's plain local backend, ``local:`` names resolved.

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
    return profile
