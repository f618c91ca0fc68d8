"""A CI-sized ``specgate drafts train`` on CPU: 24 prompts, 16-token answers, one epoch.

Real stages (transformers distillation in the vLLM venv, ``speculators prepare-data``, hidden
states, speculators' trainer patched for CPU, strip) but no gate, so no vLLM server starts.
A few minutes on 2 cores; it creates the speculators venv on first use.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from backends.drafts.head_check import check_head
from backends.drafts.pipeline import plain_target
from cli.drafts import DEFAULT_CONFIG

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ROOT / "tests" / "data" / "drafts" / "smoke_prompts.jsonl"


def train(out: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "cli", "drafts", "train", "--prompts", str(PROMPTS)]
    argv += ["--out", str(out), "--max-new-tokens", "16", "--epochs", "1", "--no-gate"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=ROOT)


def test_smoke_train_writes_a_head_without_embedding(tmp_path: Path) -> None:
    out = tmp_path / "head"
    done = train(out)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    target, _served = plain_target(DEFAULT_CONFIG)
    info = check_head(out, target)  # an EAGLE-3 head for this target
    assert not info.has_embedding and "fc.weight" in info.tensors
    work = tmp_path / "head.work"
    assert not (work / "hs").exists()  # hidden states deleted after training
    again = train(out)  # every stage is marked done: a rerun only skips
    assert again.returncode == 0 and again.stdout.count("done before, skipped") == 5
